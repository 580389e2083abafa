"""A model folder's review of its own predictions: what it states beside each landmark.

The parts a model folder carries besides its networks, fitted in training, chosen in
planning and applied in inference, so every stage imports them from here (below all of
them): the calibration of error radii and of absence (:mod:`.calibration`,
:mod:`.presence`), the shape check's measured power (:mod:`.shape_power`) and what every
output says they rest on (:mod:`.basis`).
"""
