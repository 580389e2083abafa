"""Train heatmap3d; launch with torchrun for several processes, or with python for one.

    torchrun --standalone --nproc_per_node=2 train_ddp.py                 # the demo
    torchrun --nproc_per_node=4 train_ddp.py --config configs/my.yaml train.epochs=50
    torchrun --nproc_per_node=4 train_ddp.py --data my_dataset train.budget_minutes=60
    python train_ddp.py --resume                                          # one process

Without ``--config``, ``--data`` or ``--plan`` it uses configs/demo.yaml. All the logic lives
in heatmap3d (``heatmap3d train``).
"""

import sys
from pathlib import Path

from heatmap3d.commands.main import entry

if __name__ == "__main__":
    args = sys.argv[1:]
    given = {a.split("=")[0] for a in args if a.startswith("--")}
    if not given & {"--config", "--data", "--plan"}:  # nothing to train on: the demo
        args = ["--config", str(Path(__file__).resolve().parent / "configs" / "demo.yaml"), *args]
    entry(["train", *args])
