"""heatmap3d beside the tools users would pick instead, on the same data, minutes and
machine (issue 44); run as ``python -m benchmarks.peers`` (see its ``__main__``).

One module a peer, each exposing ``run(data, work, ...) -> list[PeerResult]``:
:mod:`~benchmarks.peers.ants_peer` (multi-atlas registration),
:mod:`~benchmarks.peers.landmarker_peer`, :mod:`~benchmarks.peers.monai_peer` and
:mod:`~benchmarks.peers.heatmap3d_peer`; the sets they run on in
:mod:`~benchmarks.peers.sets`, the learned peers' fixed grid in
:mod:`~benchmarks.peers.grid`, results and their files in :mod:`~benchmarks.peers.result`,
the table in :mod:`~benchmarks.peers.table`. The peers' packages are imported only where
they run (``pip install -e '.[peers]'``).
"""
