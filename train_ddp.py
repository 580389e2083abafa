"""Train heatmap3d; launch with torchrun for several processes, or with python for one.

    torchrun --standalone --nproc_per_node=2 train_ddp.py                 # the demo
    torchrun --nproc_per_node=4 train_ddp.py --config configs/my.yaml train.epochs=50
    python train_ddp.py --resume                                          # one process

Without ``--config`` it uses configs/demo.yaml. All the logic lives in heatmap3d.training.trainer.
"""

import sys
from pathlib import Path

from heatmap3d.cli import entry

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--config" not in args and not any(a.startswith("--config=") for a in args):
        args = ["--config", str(Path(__file__).resolve().parent / "configs" / "demo.yaml"), *args]
    entry(["train", *args])
