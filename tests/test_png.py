"""The PNG writer of drawn figures: read back by Pillow and by matplotlib, its files are the pixels given."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from analysis import png


def _read(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()  # checks every chunk's CRC and the deflated rows
    return image


@settings(max_examples=60, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from([3, 4]))),
       st.floats(1, 1200))
def test_the_file_holds_the_pixels_given(pixels, dpi):
    image = _read(png.encode(pixels, dpi, "test"))
    opaque = pixels.shape[2] == 3 or bool((pixels[:, :, 3] == 255).all())
    assert image.mode == ("RGB" if opaque else "RGBA")
    expected = pixels[:, :, :3] if opaque else pixels
    assert np.array_equal(np.asarray(image), expected)
    assert image.info["dpi"][0] == pytest.approx(dpi, abs=0.02)
    assert image.info["Software"] == "test"


def test_a_figure_drawn_and_written_here_reads_back_as_drawn(tmp_path):
    """The pixels of a real figure, written here, read by matplotlib as they were drawn; transparency kept."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure, axis = plt.subplots(figsize=(3, 2))
    axis.plot([1, 2, 4], [3, 1, 2], "o-")
    axis.set_title("steps to result")
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    drawn = np.asarray(canvas.buffer_rgba()).copy()
    plt.close(figure)
    path = tmp_path / "figure.png"
    png.write(path, drawn, 150, "test")
    read = (matplotlib.image.imread(path) * 255).round().astype(np.uint8)
    assert read.shape[2] == 3 and np.array_equal(read, drawn[:, :, :3])
    see_through = drawn.copy()
    see_through[:10, :10, 3] = 0
    png.write(path, see_through, 150, "test")
    assert np.array_equal(np.asarray(_read(path.read_bytes())), see_through)


@pytest.mark.parametrize("pixels", [np.zeros((2, 2, 3), dtype=np.float32), np.zeros((2, 2), dtype=np.uint8),
                                    np.zeros((2, 2, 2), dtype=np.uint8), np.zeros((0, 2, 3), dtype=np.uint8)])
def test_what_is_not_rows_of_pixels_is_refused(pixels):
    with pytest.raises(ValueError, match="rows of RGB or RGBA bytes"):
        png.encode(pixels, 150, "test")
