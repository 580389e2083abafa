"""``python -m heatmap3d``: the ``heatmap3d`` command, as torchrun starts it
(``torchrun --nproc_per_node=4 -m heatmap3d predict --model runs/m scans/ --out P``)."""

from heatmap3d.commands.main import entry

if __name__ == "__main__":
    entry()
