import torch

from heatmap3d.inference.sliding import gaussian_weights, sliding_window, window_starts


def test_window_starts_cover_the_axis_with_overlap():
    assert window_starts(10, 16, 0.5) == [0]
    assert window_starts(40, 16, 0.5) == [0, 8, 16, 24]
    starts = window_starts(37, 16, 0.5)
    covered = set()
    for s in starts:
        covered |= set(range(s, s + 16))
    assert covered == set(range(37)) and starts[-1] == 37 - 16


def test_weights_peak_in_the_centre_and_stay_positive():
    w = gaussian_weights((9, 8, 16))
    assert w.shape == (9, 8, 16) and (w > 0).all()
    # centre voxels of the even axes are half a voxel off the peak (sigma 1 and 2 voxels)
    assert torch.isclose(w[4, 3:5, 7:9].min(), torch.exp(torch.tensor(-0.125 - 0.25 / 8)))
    assert w[4, 3:5, 7:9].min() == w.max() and w[0, 0, 0] < 0.01


def test_equals_single_pass_for_a_network_without_spatial_context():
    """A pointwise network gives the same output whatever the window: blending must too."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv3d(2, 5, 1), torch.nn.Tanh(), torch.nn.Conv3d(5, 3, 1))
    image = torch.randn(1, 2, 37, 29, 20)
    single = net(image)
    blended = sliding_window(net, image, (16, 16, 16), overlap=0.5, batch=3)
    assert blended.shape == single.shape
    torch.testing.assert_close(blended, single, atol=1e-5, rtol=1e-5)


def test_small_image_is_padded_and_cropped_back():
    calls = []

    def net(x):
        calls.append(tuple(x.shape))
        return x[:, :1] * 2

    image = torch.randn(1, 1, 10, 20, 12)
    out = sliding_window(net, image, (16, 16, 16), overlap=0.25)
    assert all(c[2:] == (16, 16, 16) for c in calls)
    torch.testing.assert_close(out, image * 2)


def test_landmarks_decoded_from_windows_match_one_pass():
    """A network with spatial context (a 5x5x5 smoothing convolution) differs slightly at
    window seams, but the landmark decoded from the blended heatmap is the same."""
    from heatmap3d.heatmaps import gaussian_heatmaps
    from heatmap3d.inference.decode import decode_heatmaps

    smooth = torch.nn.Conv3d(1, 1, 5, padding=2, bias=False)
    torch.nn.init.constant_(smooth.weight, 1 / 125)
    coords = torch.tensor([[[9.3, 20.6, 31.2]], [[25.5, 12.25, 17.8]], [[33.1, 30.4, 6.6]]])
    for point in coords:
        image = gaussian_heatmaps(point[None], (40, 40, 40), sigma=3.0)
        with torch.no_grad():
            single = smooth(image)
        blended = sliding_window(smooth, image, (24, 24, 24), overlap=0.5)
        a, _ = decode_heatmaps(single, window=3.0)
        b, _ = decode_heatmaps(blended, window=3.0)
        # Measured: 0.001 voxel in the middle, 0.09 for the blob near a seam and a corner.
        assert (a - b).norm() < 0.15, (point, a, b)
        assert (b - point).norm() < 0.15
