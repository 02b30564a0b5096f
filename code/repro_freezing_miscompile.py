"""Inductor freezing drops a summand of an HRNet fuse layer (lost read-after-write on CPU).

Standalone reproducer (imports only torch), written to be filed upstream as it is.

With ``torch._inductor.config.freezing = True`` on CPU, Inductor rewrites ``conv(x) + other`` into the
in-place oneDNN call ``torch.ops.mkldnn._convolution_pointwise_.binary(other, x, ..., 'add', ...)``,
which adds the convolution's result *into* ``other``'s buffer. In an HRNet fuse layer the sum of three
branches is then finished by a generated C++ kernel that reads that buffer. With scheduler fusion on,
that kernel is fused with the kernel that produces another branch and is emitted *before* the in-place
call: it reads the buffer before the convolution has been added, so one of the three summands is
silently dropped. With ``max_fusion_size=1`` (no scheduler fusion) the order is right and the output
matches eager. The model below is a small HRNet (BlurBall's architecture), random weights, eval mode, float32.

Run::

    python repro_freezing_miscompile.py              # exit 1 while the bug is present, 0 when fixed
    python repro_freezing_miscompile.py --threads 2 --height 32 --width 64

Exit status: 0 compiled output matches eager; 1 it does not (the bug); 2 bad arguments.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time

import torch
import torch._inductor.config as inductor_config
from torch import nn

ATOL = 1e-4  # float32 reassociation stays far below this; a dropped summand is far above it


# ----------------------------------------------------------------------------------------- the model
def conv_bn(cin, cout, k=3, stride=1, relu=True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class SEBlock(nn.Module):
    """HRNet BasicBlock with squeeze-and-excitation before the residual add."""

    def __init__(self, c):
        super().__init__()
        self.a, self.b = conv_bn(c, c), conv_bn(c, c, relu=False)
        self.fc = nn.Sequential(nn.Linear(c, max(c // 16, 1), bias=False), nn.ReLU(),
                                nn.Linear(max(c // 16, 1), c, bias=False), nn.Sigmoid())

    def forward(self, x):
        y = self.b(self.a(x))
        return torch.relu(y * self.fc(y.mean((2, 3)))[:, :, None, None] + x)


class Stage(nn.Module):
    """Parallel branches, then every branch summed into every output (the fuse layer)."""

    def __init__(self, ch):
        super().__init__()
        self.blocks = nn.ModuleList(SEBlock(c) for c in ch)
        self.paths = nn.ModuleList(nn.ModuleList(self._path(ch, j, i) for j in range(len(ch)))
                                   for i in range(len(ch)))

    @staticmethod
    def _path(ch, j, i):
        if j == i:
            return nn.Identity()
        if j > i:  # lower resolution into higher: 1x1 conv, BN, nearest upsampling
            return nn.Sequential(conv_bn(ch[j], ch[i], 1, relu=False), nn.Upsample(scale_factor=2 ** (j - i)))
        steps = [conv_bn(ch[j], ch[j], 3, 2) for _ in range(i - j - 1)]   # higher into lower: stride 2
        return nn.Sequential(*steps, conv_bn(ch[j], ch[i], 3, 2, relu=False))

    skip = None  # (output i, branch j): leave that summand out, to show which one the compiled code drops

    def forward(self, xs):
        xs = [block(x) for block, x in zip(self.blocks, xs)]
        out = []
        for i, paths in enumerate(self.paths):
            terms = [paths[j](xs[j]) for j in range(len(xs)) if (i, j) != self.skip]
            total = terms[0]
            for term in terms[1:]:
                total = total + term                 # the multi-branch sum of the fuse layer
            out.append(torch.relu(total))
        return out


class SmallHRNet(nn.Module):
    def __init__(self, ch=(16, 32, 64, 128)):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(9, 64), conv_bn(64, 64))
        self.bottleneck = nn.Sequential(conv_bn(64, 32, 1), conv_bn(32, 32), conv_bn(32, 128, 1, relu=False))
        self.shortcut = conv_bn(64, 128, 1, relu=False)
        self.t1 = nn.ModuleList([conv_bn(128, ch[0]), conv_bn(128, ch[1], 3, 2)])
        self.s2, self.t2 = Stage(ch[:2]), conv_bn(ch[1], ch[2], 3, 2)
        self.s3, self.t3 = Stage(ch[:3]), conv_bn(ch[2], ch[3], 3, 2)
        self.s4 = Stage(ch[:4])
        self.head = nn.Conv2d(ch[0], 3, 1)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.bottleneck(x) + self.shortcut(x))
        xs = self.s2([t(x) for t in self.t1])
        xs = self.s3(xs + [self.t2(xs[-1])])
        xs = self.s4(xs + [self.t3(xs[-1])])
        return self.head(xs[0])


def build(height: int = 32, width: int = 64, seed: int = 0):
    """(model, inputs): the seeded model in eval mode with non-trivial BN statistics, and its input."""
    torch.manual_seed(seed)
    model = SmallHRNet()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.75, 1.25)
                m.bias.normal_(0, 0.1)
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.75, 1.25)
    return model.eval(), (torch.randn(1, 9, height, width),)


# ------------------------------------------------------------------------------------------ the check
def compiled_output(model, inputs, **config):
    torch._dynamo.reset()
    with inductor_config.patch(freezing=True, **config), torch.no_grad():
        return torch.compile(model)(*inputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Inductor freezing miscompile reproducer")
    parser.add_argument("--height", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-control", action="store_true", help="skip the max_fusion_size=1 control run")
    args = parser.parse_args(argv)
    if args.height < 8 or args.width < 8 or args.height % 8 or args.width % 8 or args.threads < 1:
        parser.error("--height and --width must be positive multiples of 8, --threads at least 1")

    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{platform.system()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"threads {torch.get_num_threads()}")
    print("command: python " + " ".join([sys.argv[0].rsplit("/", 1)[-1]] + (argv if argv is not None else sys.argv[1:])))
    model, inputs = build(args.height, args.width, args.seed)
    with torch.no_grad():
        expected = model(*inputs)
    start = time.perf_counter()
    actual = compiled_output(model, inputs)
    seconds = time.perf_counter() - start
    diff = (actual - expected).abs().max().item()
    print(f"expected (eager):              {expected.flatten()[:4].tolist()}")
    print(f"actual (compile, freezing):    {actual.flatten()[:4].tolist()}")
    print(f"max abs diff, freezing:        {diff:.6g}  (largest |expected| {expected.abs().max().item():.4g}; "
          f"compile {seconds:.1f} s)")
    if not args.skip_control:
        control = compiled_output(model, inputs, max_fusion_size=1)
        print(f"max abs diff, max_fusion_size=1: {(control - expected).abs().max().item():.6g}  (control)")
    present = not diff <= ATOL
    if present:  # which summand is missing: eager with one fuse-layer term left out, compared with actual
        for name in ("s2", "s3", "s4"):
            stage = getattr(model, name)
            n = len(stage.blocks)
            for i in range(n):
                for j in range(n):
                    stage.skip = (i, j)
                    with torch.no_grad():
                        without = model(*inputs)
                    stage.skip = None
                    gap = (actual - without).abs().max().item()
                    if gap <= ATOL:
                        print(f"actual == eager without summand paths[{j}](xs[{j}]) of {name} fuse output {i} "
                              f"(max abs diff {gap:.3g}): that term is dropped")
    print(f"verdict: {'BUG PRESENT' if present else 'fixed'} in torch {torch.__version__} "
          f"(max abs diff {diff:.6g} {'>' if present else '<='} {ATOL})")
    return 1 if present else 0


if __name__ == "__main__":
    sys.exit(main())
