"""ImageNet-style ResNet training written the way Apex's amp examples were, run unchanged on native PyTorch.

Nothing in this file knows about ampkit: it imports ``apex`` as a 2019-2024 training script did. Run it with

    python -m ampkit.apex examples/legacy_apex/main_amp.py --opt-level O1
    python -m ampkit.apex examples/legacy_apex/main_amp.py --opt-level O2 --out runs/o2
    python -m ampkit.apex examples/legacy_apex/main_amp.py --opt-level O2 --out runs/o2 --epochs 8 --resume runs/o2/checkpoint.pth.tar
    WORLD_SIZE=2 torchrun --nproc-per-node 2 -m ampkit.apex examples/legacy_apex/main_amp.py --opt-level O1

and ``import apex`` resolves to ``ampkit.apex``. The data are scikit-learn's bundled 8x8 digits (real,
offline), upsampled to 3x32x32 uint8 "ImageNet-style" images and normalised on the fly; torchvision is not
needed. The last line printed is machine-readable: ``FINAL top1=... top5=... loss=...``.
"""

import argparse
import hashlib
import json
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed

try:
    from apex import amp
    from apex.fp16_utils import to_python_float
    from apex.parallel import DistributedDataParallel as DDP
except ImportError as err:
    raise ImportError(
        "This example is written against NVIDIA Apex. Run it with `python -m ampkit.apex main_amp.py ...` "
        "(or install apex)."
    ) from err

ARCHS = {"resnet8": (1, 1, 1), "resnet14": (2, 2, 2), "resnet20": (3, 3, 3)}
IMAGE_SIZE = 32
NUM_CLASSES = 10


def parse():
    parser = argparse.ArgumentParser(description="ImageNet-style training with Apex amp (digits, 3x32x32)")
    parser.add_argument("-a", "--arch", default="resnet8", choices=sorted(ARCHS), help="model architecture (default: resnet8)")
    parser.add_argument("--width", default=16, type=int, help="channels of the first stage; doubled per stage (default: 16)")
    parser.add_argument("-j", "--workers", default=0, type=int, metavar="N", help="data loading workers (default: 0)")
    parser.add_argument("--epochs", default=5, type=int, metavar="N", help="total epochs to run")
    parser.add_argument("--start-epoch", default=0, type=int, metavar="N", help="manual epoch number (useful on restarts)")
    parser.add_argument("-b", "--batch-size", default=32, type=int, metavar="N", help="mini-batch size per process (default: 32)")
    parser.add_argument("--lr", "--learning-rate", default=0.8, type=float, metavar="LR",
                        help="initial learning rate for a total batch of 256; scaled linearly by batch_size*world_size/256")
    parser.add_argument("--lr-steps", default="4", type=str, help="comma-separated epochs at which the LR is divided by 10 (default: 4)")
    parser.add_argument("--warmup-epochs", default=1, type=int, help="linear LR warm-up, per iteration (default: 1)")
    parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
    parser.add_argument("--weight-decay", "--wd", default=5e-4, type=float, metavar="W", help="weight decay (default: 5e-4)")
    parser.add_argument("--print-freq", "-p", default=10, type=int, metavar="N", help="print every N iterations (default: 10)")
    parser.add_argument("--resume", default="", type=str, metavar="PATH", help="path to a checkpoint to resume from")
    parser.add_argument("--out", "--checkpoint-dir", dest="out", default="", type=str, metavar="DIR",
                        help="write checkpoint.pth.tar, model_best.pth.tar and summary.json here (default: save nothing)")
    parser.add_argument("-e", "--evaluate", dest="evaluate", action="store_true", help="evaluate the model on the validation set")
    parser.add_argument("--seed", default=0, type=int, help="seed for weights, data order and augmentation")
    parser.add_argument("--fused-sgd", action="store_true", help="use apex.optimizers.FusedSGD instead of torch.optim.SGD")
    parser.add_argument("--channels-last", action="store_true", help="channels_last memory format for model and inputs")
    parser.add_argument("--sync_bn", action="store_true", help="use apex.parallel.SyncBatchNorm (several CUDA processes; torch has no CPU kernel for it)")
    parser.add_argument("--local_rank", "--local-rank", default=int(os.environ.get("LOCAL_RANK", 0)), type=int)
    # amp's knobs, passed through as strings exactly as Apex's examples did.
    parser.add_argument("--opt-level", type=str, default="O0", help="amp optimization level: O0 (fp32), O1, O2, O3")
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None, help="override: True or False")
    parser.add_argument("--loss-scale", type=str, default=None, help="override: 'dynamic' or a number such as 128.0")
    return parser.parse_args()


# ----------------------------------------------------------------------------------------------- model
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, plus a shortcut (a 1x1 projection when the shape changes)."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """A small ImageNet-layout ResNet: 3x3 stem and max-pool (32 -> 16), three stages (16, 8, 4), pooling, a classifier."""

    def __init__(self, blocks, width=16, num_classes=NUM_CLASSES):
        super().__init__()
        self.conv1 = conv3x3(3, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, inplanes = [], width
        for i, n in enumerate(blocks):
            planes = width * 2**i
            layers = []
            for j in range(n):
                layers.append(BasicBlock(inplanes, planes, stride=2 if (i > 0 and j == 0) else 1))
                inplanes = planes
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------------------------- data
def digits_as_images():
    """(train_images, train_labels, val_images, val_labels): uint8 (N, 3, 32, 32) images; a fixed 80/20 split.

    scikit-learn's 1,797 bundled 8x8 digits (grey levels 0..16), bilinearly upsampled to 32x32 and repeated
    over three channels, so the pipeline looks like an ImageNet one: uint8 images, per-channel mean/std
    normalisation on the device, random-shift augmentation. The split does not depend on --seed.
    """
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    images = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    labels = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1234))
    cut = int(0.8 * len(images))
    return images[order[:cut]], labels[order[:cut]], images[order[cut:]], labels[order[cut:]]


class ShardSampler(torch.utils.data.Sampler):
    """Every world_size-th index from rank on, in order: a validation split with no padding or duplicates."""

    def __init__(self, n, rank, world_size):
        self.indices = list(range(rank, n, world_size))

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


def random_shift(images, max_shift, generator):
    """Translate each uint8 image by up to ``max_shift`` pixels each way, filling with background (0)."""
    n, _, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=generator).tolist()
    return torch.stack([padded[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets)])


class Normalize:
    """uint8 batch -> normalised float batch on the device (what Apex's data_prefetcher did on the GPU)."""

    def __init__(self, mean, std, device, channels_last):
        self.mean = torch.tensor(mean, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, 3, 1, 1)
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, images, target):
        images = images.to(self.device, non_blocking=True).float().sub_(self.mean).div_(self.std)
        return images.contiguous(memory_format=self.memory_format), target.to(self.device, non_blocking=True)


# ----------------------------------------------------------------------------------------------- main
best_prec1 = 0.0
args = None


def main():
    global best_prec1, args
    args = parse()

    args.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    args.world_size, args.rank = 1, 0
    if torch.cuda.is_available():
        args.device = torch.device("cuda", args.local_rank)
        torch.cuda.set_device(args.device)
    else:
        args.device = torch.device("cpu")
    if args.distributed:
        dist.init_process_group(backend="nccl" if args.device.type == "cuda" else "gloo", init_method="env://")
        args.world_size, args.rank = dist.get_world_size(), dist.get_rank()

    torch.manual_seed(args.seed)
    print(f"opt_level = {args.opt_level}")
    print(f"keep_batchnorm_fp32 = {args.keep_batchnorm_fp32} {type(args.keep_batchnorm_fp32)}")
    print(f"loss_scale = {args.loss_scale} {type(args.loss_scale)}")
    print(f"torch {torch.__version__}, device {args.device}, world size {args.world_size}")

    model = ResNet(ARCHS[args.arch], width=args.width)
    if args.sync_bn:
        import apex

        print("using apex synced BN")
        model = apex.parallel.convert_syncbn_model(model)
    model = model.to(args.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)

    # Linear scaling of the learning rate with the total batch size, as the Apex examples did.
    args.lr = args.lr * float(args.batch_size * args.world_size) / 256.0
    if args.fused_sgd:
        from apex.optimizers import FusedSGD

        optimizer = FusedSGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)

    # amp.initialize before the model is wrapped for data parallelism.
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=args.opt_level,
        keep_batchnorm_fp32=args.keep_batchnorm_fp32,
        loss_scale=args.loss_scale,
    )
    if args.distributed:
        # Gradients are all-reduced once the whole backward pass is done.
        model = DDP(model, delay_allreduce=True)

    criterion = nn.CrossEntropyLoss().to(args.device)

    # Resume after amp.initialize (and after DDP wrapping): model, optimizer, then amp's own state.
    if args.resume:
        if not os.path.isfile(args.resume):
            raise SystemExit(f"=> no checkpoint found at '{args.resume}'")
        print(f"=> loading checkpoint '{args.resume}'")
        checkpoint = torch.load(args.resume, map_location=args.device, weights_only=True)
        if checkpoint["arch"] != args.arch:
            raise SystemExit(f"=> checkpoint is a {checkpoint['arch']}, not a {args.arch}")
        args.start_epoch = checkpoint["epoch"]
        best_prec1 = checkpoint["best_prec1"]
        unwrap(model).load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        print(f"=> loaded checkpoint '{args.resume}' (epoch {checkpoint['epoch']})")

    train_images, train_labels, val_images, val_labels = digits_as_images()
    channel = train_images.float().mean(dim=(0, 2, 3)), train_images.float().std(dim=(0, 2, 3))
    prepare = Normalize(channel[0].tolist(), channel[1].tolist(), args.device, args.channels_last)
    train_dataset = torch.utils.data.TensorDataset(train_images, train_labels)
    val_dataset = torch.utils.data.TensorDataset(val_images, val_labels)
    # The shuffle depends on (seed, epoch) only, so a resumed run sees the batches an uninterrupted one would.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=args.world_size, rank=args.rank, shuffle=True, seed=args.seed
    )
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, drop_last=True,
        pin_memory=args.device.type == "cuda",
    )
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=256, sampler=ShardSampler(len(val_dataset), args.rank, args.world_size),
        num_workers=args.workers, pin_memory=args.device.type == "cuda",
    )

    if args.evaluate:
        prec1, prec5, val_loss = validate(val_loader, model, criterion, prepare)
        print_final(prec1, prec5, val_loss, [], model, optimizer)
        return

    history, epoch_times = [], []
    prec1 = prec5 = val_loss = float("nan")
    for epoch in range(args.start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        start = time.perf_counter()
        train_loss, train_top1 = train(train_loader, model, criterion, optimizer, epoch, prepare)
        epoch_times.append(time.perf_counter() - start)
        prec1, prec5, val_loss = validate(val_loader, model, criterion, prepare)

        is_best = prec1 > best_prec1
        best_prec1 = max(prec1, best_prec1)
        scale = amp.state_dict()["loss_scaler0"]["loss_scale"]
        if args.rank == 0:
            print(
                f"Epoch: [{epoch}] done  Time {epoch_times[-1]:.2f}s  Loss {train_loss:.4f}  Train Prec@1 {train_top1:.3f}  "
                f"Val Loss {val_loss:.4f}  Val Prec@1 {prec1:.3f}  Val Prec@5 {prec5:.3f}  loss scale {scale:g}"
            )
        history.append(dict(epoch=epoch, seconds=epoch_times[-1], train_loss=train_loss, train_top1=train_top1,
                            val_loss=val_loss, top1=prec1, top5=prec5, lr=optimizer.param_groups[0]["lr"], loss_scale=scale))
        if args.rank == 0 and args.out:
            save_checkpoint({
                "epoch": epoch + 1,
                "arch": args.arch,
                "state_dict": unwrap(model).state_dict(),
                "best_prec1": best_prec1,
                "optimizer": optimizer.state_dict(),
                "amp": amp.state_dict(),
            }, is_best, args.out)

    print_final(prec1, prec5, val_loss, history, model, optimizer, epoch_times)
    if args.distributed:
        dist.destroy_process_group()


def unwrap(model):
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def weights_digest(model):
    """sha256 of every tensor of ``model.state_dict()``: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, tensor in unwrap(model).state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def print_final(prec1, prec5, val_loss, history, model, optimizer, epoch_times=()):
    if args.rank != 0:
        return
    sec = sum(epoch_times) / len(epoch_times) if epoch_times else float("nan")
    print(f"FINAL top1={prec1:.3f} top5={prec5:.3f} loss={val_loss:.6f} best_top1={best_prec1:.3f} "
          f"opt_level={args.opt_level} epochs={args.epochs} sec_per_epoch={sec:.3f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        summary = dict(
            opt_level=args.opt_level, arch=args.arch, width=args.width, epochs=args.epochs, start_epoch=args.start_epoch,
            seed=args.seed, batch_size=args.batch_size, world_size=args.world_size, lr=args.lr, torch=torch.__version__,
            device=str(args.device), top1=prec1, top5=prec5, loss=val_loss, best_top1=best_prec1,
            sec_per_epoch=sec, history=history, amp={k: v for k, v in amp.state_dict().items() if k != "master_weights"},
            model_dtypes=sorted({str(p.dtype) for p in unwrap(model).parameters()}),
            weights_sha256=weights_digest(model),
        )
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)


def train(train_loader, model, criterion, optimizer, epoch, prepare):
    batch_time, losses, top1, top5 = AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter()
    model.train()
    generator = torch.Generator().manual_seed(args.seed * 100_003 + epoch * 1_009 + args.rank)
    loss_sum = torch.zeros((), device=args.device)  # summed on the device, read once per epoch
    correct_sum = torch.zeros((), device=args.device)
    seen = 0
    end, last_print = time.perf_counter(), -1
    len_epoch = len(train_loader)
    for i, (images, target) in enumerate(train_loader):
        adjust_learning_rate(optimizer, epoch, i, len_epoch)
        images, target = prepare(random_shift(images, 3, generator), target)

        output = model(images)
        loss = criterion(output, target)

        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

        loss_sum += loss.detach() * target.size(0)
        correct_sum += (output.detach().argmax(1) == target).sum()
        seen += target.size(0)
        if i % args.print_freq == 0 or i == len_epoch - 1:
            # Reading values forces a sync; only every print_freq iterations, as in Apex's examples.
            prec1, prec5 = accuracy(output.detach(), target, topk=(1, 5))
            reduced_loss = reduce_tensor(loss.detach()) if args.distributed else loss.detach()
            if args.distributed:
                prec1, prec5 = reduce_tensor(prec1), reduce_tensor(prec5)
            losses.update(to_python_float(reduced_loss), images.size(0))
            top1.update(to_python_float(prec1), images.size(0))
            top5.update(to_python_float(prec5), images.size(0))
            batch_time.update((time.perf_counter() - end) / (i - last_print))
            end, last_print = time.perf_counter(), i
            if args.rank == 0:
                speed = args.world_size * args.batch_size / batch_time.val
                print(
                    f"Epoch: [{epoch}][{i}/{len_epoch}]  Time {batch_time.val:.3f} ({batch_time.avg:.3f})  "
                    f"Speed {speed:.1f} img/s  Loss {losses.val:.4f} ({losses.avg:.4f})  "
                    f"Prec@1 {top1.val:.3f} ({top1.avg:.3f})  Prec@5 {top5.val:.3f} ({top5.avg:.3f})"
                )
    totals = torch.stack([loss_sum, correct_sum.float(), torch.tensor(float(seen), device=args.device)])
    if args.distributed:
        dist.all_reduce(totals)
    loss_total, correct, count = totals.tolist()
    return loss_total / count, 100.0 * correct / count


@torch.no_grad()
def validate(val_loader, model, criterion, prepare):
    model.eval()
    # (summed loss, top-1 hits, top-5 hits, images) over this rank's shard; summed over ranks at the end.
    totals = torch.zeros(4, dtype=torch.float64, device=args.device)
    for i, (images, target) in enumerate(val_loader):
        images, target = prepare(images, target)
        output = model(images)
        loss = criterion(output, target)
        top = output.topk(5, dim=1).indices
        hits = top.eq(target.view(-1, 1))
        totals += torch.stack([
            loss.double() * target.size(0), hits[:, :1].sum().double(), hits.sum().double(),
            torch.tensor(float(target.size(0)), dtype=torch.float64, device=args.device),
        ])
    if args.distributed:
        dist.all_reduce(totals)
    loss_sum, hit1, hit5, count = totals.tolist()
    prec1, prec5, val_loss = 100.0 * hit1 / count, 100.0 * hit5 / count, loss_sum / count
    if args.rank == 0:
        print(f" * Prec@1 {prec1:.3f} Prec@5 {prec5:.3f} Loss {val_loss:.4f}")
    model.train()
    return prec1, prec5, val_loss


def save_checkpoint(state, is_best, directory, filename="checkpoint.pth.tar"):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a crash while saving keeps the previous checkpoint
    if is_best:
        shutil.copyfile(path, os.path.join(directory, "model_best.pth.tar"))


class AverageMeter:
    """Keeps the latest value and the running average."""

    def __init__(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def adjust_learning_rate(optimizer, epoch, step, len_epoch):
    """Divide the LR by 10 at each of --lr-steps; ramp it up linearly over the first --warmup-epochs."""
    milestones = [int(s) for s in args.lr_steps.split(",") if s.strip()]
    lr = args.lr * 0.1 ** sum(epoch >= m for m in milestones)
    if epoch < args.warmup_epochs:
        lr = lr * float(1 + step + epoch * len_epoch) / (args.warmup_epochs * len_epoch)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def accuracy(output, target, topk=(1,)):
    """Precision@k in percent for each k, as 0-d tensors (no sync until read)."""
    maxk = max(topk)
    pred = output.topk(maxk, dim=1).indices
    hits = pred.eq(target.view(-1, 1))
    return [hits[:, :k].any(dim=1).float().mean() * 100.0 for k in topk]


def reduce_tensor(tensor):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    return rt / args.world_size


if __name__ == "__main__":
    main()
