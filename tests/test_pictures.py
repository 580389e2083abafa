"""Anatomical pictures: radiological orientation whatever the storage, markers, labels, PNG."""

import numpy as np
import pytest
from PIL import Image

from heatmap3d.errors import InputError
from heatmap3d.evaluation.pictures import (
    LABEL_PX,
    PRED_COLOUR,
    REVIEW_LABEL,
    TRUE_COLOUR,
    _caption,
    landmark_views,
    snapshot,
    view_origin,
    write_png,
)
from heatmap3d.evaluation.slices import anatomical_slice
from heatmap3d.geometry import Volume, voxel_to_world
from heatmap3d.io.destination import Destination
from heatmap3d.predictions.scan_files import is_ours

S = 121  # default view size; 1 mm pixels; the centre pixel is (60, 60)
HALF = (S - 1) / 2
BLOB = np.array([-15.0, 10.0, 20.0])  # patient's left, anterior, superior of the centre


def _grid(spacing, shape):
    """Affine with ``spacing`` whose voxel centres are symmetric about world 0 (so world 0
    and the planes through it hit voxel centres exactly)."""
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = -np.asarray(spacing) * (np.asarray(shape) - 1) / 2
    return affine


def _sampled(affine, shape, centre=BLOB, sigma=4.0):
    """A bright Gaussian blob at world ``centre`` on a dim background, sampled on the grid."""
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1)
    world = voxel_to_world(grid.reshape(-1, 3), affine).reshape(*shape, 3)
    return Volume(100 + 900 * np.exp(-((world - centre) ** 2).sum(-1) / (2 * sigma**2)), affine)


def _ras():
    return _sampled(_grid((2.0, 2.0, 2.0), (41, 41, 41)), (41, 41, 41))


def _lps_flipped():
    """The same voxels stored LPS: axes 0 and 1 reversed, affine to match."""
    ref = _ras()
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    flip[:2, 3] = 40  # new voxel v -> old voxel 40 - v along i and j
    return Volume(ref.data[::-1, ::-1, :], ref.affine @ flip)


def _permuted():
    """The same voxels with the array axes stored in the order (S, R, A)."""
    ref = _ras()
    perm = np.zeros((4, 4))
    perm[3, 3] = 1
    perm[2, 0] = perm[0, 1] = perm[1, 2] = 1  # new (a, b, c) -> old (b, c, a)
    return Volume(np.transpose(ref.data, (2, 0, 1)), ref.affine @ perm)


def _anisotropic():
    """Sampled afresh on 1 x 2.5 x 3 mm voxels, stored LPS."""
    shape = (81, 33, 29)
    affine = _grid((1.0, 2.5, 3.0), shape)
    affine[:2] *= -1  # x and y reversed: LPS storage, still centred on world 0
    return _sampled(affine, shape)


STORAGES = {"ras": _ras, "lps": _lps_flipped, "permuted": _permuted, "aniso": _anisotropic}


def _centroid(image: np.ndarray) -> np.ndarray:
    """(row, col) of the pixels above half the image's finite maximum."""
    values = np.nan_to_num(image, nan=0.0)
    rows, cols = np.nonzero(values > 100 + 0.5 * (np.nanmax(image) - 100))
    return np.array([rows.mean(), cols.mean()])


@pytest.mark.parametrize("storage", STORAGES)
def test_views_are_radiological_whatever_the_storage(storage):
    vol = STORAGES[storage]()
    # each view goes through the blob's plane, centred at the blob's projection on the
    # other two axes being 0, so the blob sits off-centre by its own coordinates (mm = px)
    axial = anatomical_slice(vol, [0.0, 0.0, BLOB[2]], "axial")
    coronal = anatomical_slice(vol, [0.0, BLOB[1], 0.0], "coronal")
    sagittal = anatomical_slice(vol, [BLOB[0], 0.0, 0.0], "sagittal")
    assert axial.shape == coronal.shape == sagittal.shape == (S, S)
    # axial: anterior (y = +10) above the centre; patient's left (x = -15) right of it
    np.testing.assert_allclose(_centroid(axial), [HALF - 10, HALF + 15], atol=0.6)
    # coronal: superior (z = +20) above; patient's left on the right
    np.testing.assert_allclose(_centroid(coronal), [HALF - 20, HALF + 15], atol=0.6)
    # sagittal: superior above; anterior (y = +10) on the left
    np.testing.assert_allclose(_centroid(sagittal), [HALF - 20, HALF - 10], atol=0.6)


def test_the_picture_does_not_depend_on_how_the_array_is_stored():
    points = np.array([[0.0, 0.0, BLOB[2]]])
    pictures = {
        name: landmark_views(make(), points, ["AC"], window=(100, 1000))
        for name, make in STORAGES.items()
    }
    # the same voxels stored differently: the same picture, pixel for pixel
    np.testing.assert_array_equal(pictures["lps"], pictures["ras"])
    np.testing.assert_array_equal(pictures["permuted"], pictures["ras"])
    # resampled on other voxels: the blob in the same place of the axial view
    top, left = view_origin(0, "axial")
    for name, picture in pictures.items():
        axial = picture[top : top + S, left : left + S].astype(float)
        white = (axial > 200).all(-1)  # the blob; markers and letters are coloured or grey
        rows, cols = np.nonzero(white)
        assert white.sum() > 20, name
        np.testing.assert_allclose([rows.mean(), cols.mean()], [HALF - 10, HALF + 15], atol=1)


def _has_colour(region: np.ndarray, colour) -> bool:
    return bool((region == np.array(colour, np.uint8)).all(-1).any())


def test_markers_at_the_landmark_and_the_truth_near_its_slice():
    vol = _ras()
    pred = np.array([[0.0, 0.0, 0.0]])
    truth = pred + [6.0, 0.0, 8.0]  # 6 mm to the patient's right, 8 mm above
    picture = landmark_views(vol, pred, ["AC"], truth_world=truth, near_mm=5.0)
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    views = {}
    for plane in ("axial", "coronal", "sagittal"):
        top, left = view_origin(0, plane)
        views[plane] = picture[top : top + S, left : left + S]
    c = int(HALF)
    for view in views.values():  # the prediction: an x at the centre of every view
        assert _has_colour(view[c - 1 : c + 2, c - 1 : c + 2], PRED_COLOUR)
    # axial (z = 0): the truth is 8 mm off the slice, more than near_mm: not drawn
    assert not _has_colour(views["axial"], TRUE_COLOUR)
    # coronal (y = 0): the truth is on the slice, 6 mm right (viewer's left), 8 mm up
    assert _has_colour(views["coronal"][c - 8, c - 6 - 4 : c - 6 + 5], TRUE_COLOUR)
    assert not _has_colour(views["coronal"][:, c + 1 :], TRUE_COLOUR)
    # sagittal (x = 0): 6 mm off the slice: not drawn
    assert not _has_colour(views["sagittal"], TRUE_COLOUR)


def test_heatmap_overlay_colours_the_landmark():
    vol = _ras()
    heat = np.zeros((1, *vol.shape), np.float32)
    heat[0, 20, 20, 20] = 1.0  # world (0, 0, 0)
    pred = np.array([[0.0, 0.0, 0.0]])
    plain = landmark_views(vol, pred, ["AC"], window=(100, 1000))
    hot = landmark_views(vol, pred, ["AC"], heatmaps=heat, window=(100, 1000))
    top, left = view_origin(0, "axial")
    # 1 px (half a voxel) above the centre: heatmap 0.5 (bilinear), between the x's arms
    r, c = int(HALF) - 1, int(HALF)
    assert tuple(plain[top + r, left + c]) == (0, 0, 0)  # background 100 is black
    red, green, blue = (int(v) for v in hot[top + r, left + c])
    assert red > 60 and red > green >= blue
    # 2 voxels away the heatmap is 0: nothing overlaid
    assert tuple(hot[top + r - 4, left + c]) == (0, 0, 0)
    with pytest.raises(ValueError, match="heatmaps"):
        landmark_views(vol, pred, ["AC"], heatmaps=heat[:, :-1])


def test_missing_landmarks_give_a_not_found_tile():
    vol = _ras()
    points = np.array([[0.0, 0.0, 0.0], [np.nan] * 3, [np.nan] * 3])
    truth = np.array([[0.0, 0.0, 0.0], [np.nan] * 3, [2.0, 0.0, 0.0]])
    picture = landmark_views(vol, points, ["A", "B", "C"], truth_world=truth, columns=3)
    assert picture.dtype == np.uint8 and picture.shape[2] == 3
    top, left = view_origin(1, "axial", columns=3)
    tile = picture[top : top + S, left : left + 3 * S]
    # no scan drawn, only the words "not found" in the middle of the tile
    text = (tile > 200).all(-1)
    rows, cols = np.nonzero(text)
    assert text.sum() > 10
    assert abs(rows.mean() - HALF) < 8 and abs(cols.mean() - tile.shape[1] / 2) < 40
    # C has no prediction but a truth: its views go through the truth, marked +
    top, left = view_origin(2, "axial", columns=3)
    axial = picture[top : top + S, left : left + S]
    assert _has_colour(axial, TRUE_COLOUR) and not _has_colour(axial, PRED_COLOUR)
    assert _caption("C", "", found=False, flagged=False) == "C  not found"


def test_snapshot_labels_confidence_and_review():
    vol = _ras()
    points = np.array([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    picture = snapshot(vol, points, ["AC", "PC"], np.array([0.9, 0.2]), [False, True])
    assert picture.dtype == np.uint8
    for index, flagged in ((0, False), (1, True)):
        top, left = view_origin(index, "axial", columns=2)
        label = picture[top - LABEL_PX : top, left : left + 3 * S]
        assert _has_colour(label, REVIEW_LABEL) is flagged
    assert _caption("PC", "conf 0.20", found=True, flagged=True) == "REVIEW  PC  conf 0.20"
    heat = np.zeros((2, *vol.shape), np.float32)
    heat[:, 20, 20, 20] = 1.0
    with_heat = snapshot(vol, points, ["AC", "PC"], np.array([0.9, 0.2]), heatmaps=heat)
    top, left = view_origin(0, "axial", columns=2)
    assert (
        with_heat[top + int(HALF) - 1, left + int(HALF), 0]
        > picture[top + int(HALF) - 1, left + int(HALF), 0]
    )


def test_which_draws_only_the_chosen_landmarks():
    vol = _ras()
    points = np.zeros((5, 3))
    assert landmark_views(vol, points, list("abcde"), which=[3]).shape == (
        LABEL_PX + S,
        3 * S + 4,
        3,
    )
    two = landmark_views(vol, points, list("abcde"), which=[0, 4], columns=1)
    assert two.shape[0] == 2 * (LABEL_PX + S) + 6


def test_write_png_round_trip_and_refusal(tmp_path):
    picture = landmark_views(_ras(), np.zeros((1, 3)), ["AC"])
    path = write_png(tmp_path, "case.png", picture)
    np.testing.assert_array_equal(np.asarray(Image.open(path).convert("RGB")), picture)
    assert is_ours(path)
    write_png(tmp_path, path.name, picture[::2])  # ours: replaced
    foreign = tmp_path / "photo.png"
    Image.fromarray(picture).save(foreign)
    before = foreign.read_bytes()
    with pytest.raises(InputError, match="photo.png: exists and was not written by heatmap3d"):
        write_png(tmp_path, foreign.name, picture)
    assert foreign.read_bytes() == before
    write_png(Destination(tmp_path, replace=True), foreign.name, picture)
    assert is_ours(foreign)
    with pytest.raises(ValueError):
        write_png(tmp_path, "x.png", picture.astype(np.float32))
