"""The ``heatmap3d`` command line: arguments parsed into typed options, handed to the
Python functions below it (:mod:`heatmap3d.api`), each failure a one-line error.

:mod:`.parser` defines every subcommand's arguments; :mod:`.main` runs one; each other
module turns one subcommand's arguments into a call of the package.
"""
