"""The packaged AFIDs prior for some of its landmarks: its marginal against a refit.

A dataset with some of the AFIDs (``--shape-prior afids``) is judged with each case aligned
on its own landmarks only. The marginal of the prior (fitted on people aligned on all 32)
is narrower than such a case varies; :meth:`~heatmap3d.review.shape_prior.PopulationShape.part`
fits the prior again on the people's configurations of those landmarks. Both checks'
power is measured as training measures it (10 folds of the 122 configurations, landmarks
moved by 5 to 40 mm, and the correct landmarks flagged per person).

    python -m benchmarks.prior_part --landmarks 1,2,3,4,5,6,7,10,14,24
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--landmarks", default="1,2,3,4,5,6,7,10,14,24", help="AFIDs numbers")
    args = p.parse_args(argv)
    from heatmap3d.review.shape_file import read_prior
    from heatmap3d.review.shape_power import measure_power

    names = args.landmarks.split(",")
    whole = read_prior("afids")
    for label, prior in (("marginal", whole.select(names)), ("refit", whole.part(names))):
        start = time.perf_counter()
        power = measure_power(prior, prior.configurations)
        caught = " / ".join(f"{100 * c:.0f}" for c in power.caught)
        print(
            f"{label:<8} {len(names)} landmarks: caught {caught} % of 5 / 10 / 20 / 40 mm "
            f"errors, {power.false_flags:.2f} correct landmarks flagged a person "
            f"({time.perf_counter() - start:.1f} s)"
        )


if __name__ == "__main__":
    main()
