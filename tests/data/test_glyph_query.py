"""memvir.data.glyphs.query against pixels worked out here: polarity from the border, ink framed as the renderer
frames it (moved here from the app's tests with the function)."""

import numpy as np
import pytest
from PIL import Image

from memvir.data.errors import DatasetError
from memvir.data.glyphs.query import glyph_query


def test_glyph_query_inverts_dark_ink_and_fits_it_like_the_renderer():
    page = np.full((100, 80), 255, dtype=np.uint8)
    page[30:50, 20:30] = 0  # 20 rows x 10 columns of black ink on white paper
    query = np.asarray(glyph_query(Image.fromarray(page), image_size=32, fit_ink=True))
    # the renderer fits ink into 32 - 2 * max(1, 32 // 16) = 28 pixels: the 20-pixel side gets a canvas of
    # ceil(20 * 32 / 28) = 23 pixels, the ink centred in it
    assert query.shape == (23, 23)
    expected = np.zeros((23, 23), dtype=np.uint8)
    top, left = (23 - 20) // 2, (23 - 10) // 2
    expected[top:top + 20, left:left + 10] = 255
    np.testing.assert_array_equal(query, expected)


def test_glyph_query_reads_a_transparent_sketch_as_paper():
    sketch = np.zeros((50, 50, 4), dtype=np.uint8)  # transparent everywhere
    sketch[10:20, 10:20] = (0, 0, 0, 255)  # a black stroke
    query = np.asarray(glyph_query(Image.fromarray(sketch, "RGBA"), image_size=32, fit_ink=False))
    assert query[15, 15] == 255 and query[0, 0] == 0 and query[40, 40] == 0


def test_glyph_query_keeps_light_ink_on_dark_as_it_is():
    render = np.zeros((32, 32), dtype=np.uint8)
    render[8:24, 14:18] = 255
    np.testing.assert_array_equal(np.asarray(glyph_query(Image.fromarray(render), 32, fit_ink=False)), render)


def test_an_empty_drawing_is_refused():
    with pytest.raises(DatasetError, match="the drawing is empty: draw a character"):
        glyph_query(Image.new("RGBA", (40, 40)), image_size=32, fit_ink=True)
