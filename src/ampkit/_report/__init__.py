"""The writing shared by the tools: figures (:mod:`.figures`), Markdown pages (:mod:`.markdown`), plain-text
tables (:mod:`.tables`) and the layout of an ``--out`` folder (:mod:`.out_dir`).

It sits below bench, numerics and memory, so each tool writes its pictures and report.md with the same pieces
without importing a sibling tool. Importing this package loads neither matplotlib nor rich: each module imports
its heavy dependency only when a function needs it.
"""
