"""mha.viz.attention_explorer: the embedded data decode to the weights given, bad input is refused, and the
viewer works in a real browser (headless Chromium, offline): it draws the chosen head, the menus switch heads and
models, and hovering a cell reads out that cell's weight."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from mha.experiments.model import TinyTransformer, TransformerConfig
from mha.experiments.viz import SCALE, attention_explorer

CHROMIUM = "/usr/bin/chromium"


def model_maps(n_heads=2, length=6, seed=0):
    """Attention weights of a small random TinyTransformer on one sequence: (n_layers, h, L, L), rows sum to 1."""
    torch.manual_seed(seed)
    model = TinyTransformer(TransformerConfig(vocab_size=8, block_size=length, n_layers=2, d_model=16,
                                              n_heads=n_heads)).eval()
    idx = torch.randint(8, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        _, _, weights = model(idx, need_weights=True)
    return torch.stack([w[0] for w in weights]).numpy().astype(np.float64), [str(int(t)) for t in idx[0]]


def payload(explorer):
    match = re.search(r'<script type="application/json">(.*?)</script>', explorer.html, re.S)
    return json.loads(match.group(1))


def test_embedded_weights_are_the_given_weights_to_three_decimals():
    weights, tokens = model_maps()
    data = payload(attention_explorer({"m": dict(weights=weights, tokens=tokens)}))
    stored = np.array(data["models"][0]["weights"]) / data["scale"]
    assert stored.shape == weights.shape
    np.testing.assert_allclose(stored, weights, atol=0.5 / SCALE + 1e-12)
    np.testing.assert_allclose(np.triu(stored, k=1), 0.0)  # causal: nothing above the diagonal
    assert data["models"][0]["tokens"] == tokens and data["models"][0]["labels"] is None


def test_tokens_cannot_end_the_script_element():
    weights = np.full((1, 1, 3, 3), 1 / 3)
    tokens = ["</script>", "<b>&", "\n"]
    explorer = attention_explorer({"m": dict(weights=weights, tokens=tokens)}, element_id="x1")
    assert explorer.html.count("</script>") == 2  # the data block's and the code block's, nothing else
    assert payload(explorer)["models"][0]["tokens"] == tokens


def test_each_viewer_gets_its_own_id():
    weights, tokens = model_maps()
    spec = {"m": dict(weights=weights, tokens=tokens)}
    assert attention_explorer(spec).element_id != attention_explorer(spec).element_id
    assert attention_explorer(spec, element_id="fixed-id").html.count('id="fixed-id"') == 1


GOOD = dict(weights=np.full((1, 2, 3, 3), 1 / 3), tokens=["a", "b", "c"])


@pytest.mark.parametrize("models, kwargs, error, words", [
    ({}, {}, TypeError, "models must be a non-empty dict"),
    ([GOOD], {}, TypeError, "models must be a non-empty dict"),
    ({"m": dict(weights=np.ones((2, 3, 3)), tokens=["a", "b", "c"])}, {}, ValueError, "(n_layers, n_heads, L, L)"),
    ({"m": dict(weights=np.ones((1, 1, 3, 4)), tokens=["a", "b", "c"])}, {}, ValueError, "got (1, 1, 3, 4)"),
    ({"m": dict(weights=np.full((1, 1, 3, 3), np.nan), tokens=["a", "b", "c"])}, {}, ValueError, "in [0, 1]"),
    ({"m": dict(weights=np.full((1, 1, 3, 3), 2.0), tokens=["a", "b", "c"])}, {}, ValueError, "in [0, 1]"),
    ({"m": dict(GOOD, tokens=["a", "b"])}, {}, ValueError, "one string per position: 3, got 2"),
    ({"m": dict(GOOD, tokens="abc")}, {}, TypeError, "tokens of model 'm' must be a list of strings"),
    ({"m": dict(GOOD, labels=[["x"]])}, {}, ValueError, "n_layers=1 lists of n_heads=2"),
    ({"m": dict(GOOD, labels=["xy"])}, {}, ValueError, "n_layers=1 lists of n_heads=2"),
    ({"m": dict(GOOD, extra=1)}, {}, ValueError, "must be a dict with keys"),
    ({"": GOOD}, {}, TypeError, "non-empty string"),
    ({"m": GOOD}, dict(size=10), ValueError, "size must be an integer >= 64, got 10"),
    ({"m": GOOD}, dict(size=100.0), TypeError, "size must be an integer >= 64"),
    ({"m": GOOD}, dict(element_id="a b"), ValueError, "element_id must be"),
])
def test_bad_input_is_refused_with_a_clear_error(models, kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        attention_explorer(models, **kwargs)


# ---------------------------------------------------------------------------------------------- in a browser
@pytest.fixture(scope="module")
def page():
    if not Path(CHROMIUM).exists():
        pytest.skip("no Chromium at /usr/bin/chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                                      "--disable-background-networking"])
        context = browser.new_context()
        tab = context.new_page()
        errors = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        tab.route("**/*", lambda r: r.abort())  # offline: the fragment must need nothing from anywhere
        tab.errors = errors
        yield tab
        browser.close()


def pixel(page, element_id, row, col):
    """The RGB colour drawn at the centre of cell (row, col) of the viewer's canvas."""
    return page.evaluate("""([id, row, col]) => {
        const canvas = document.querySelector('#' + id + ' canvas'), cell = +canvas.dataset.cell;
        const x = 14 + (col + 0.5) * cell, y = 14 + (row + 0.5) * cell;
        return Array.from(canvas.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3)); }""",
                         [element_id, row, col])


def test_viewer_draws_switches_and_reads_out_in_a_browser(page):
    w1, t1 = model_maps(n_heads=2, seed=1)
    w2, t2 = model_maps(n_heads=4, seed=2)
    w1[0, 1] = np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None]  # layer 0 head 1: uniform over the past
    w1[0, 0] = np.eye(6)  # layer 0 head 0: every query on itself
    labels = [["self", "uniform"], ["a", "b"]]
    explorer = attention_explorer({"two heads": dict(weights=w1, tokens=t1, labels=labels),
                                   "four heads": dict(weights=w2, tokens=t2)}, element_id="viewer")
    page.set_content(f"<html><body>{explorer.html}</body></html>")
    assert page.errors == []
    caption = page.locator("#viewer .mha-caption")
    assert caption.inner_text() == "two heads, layer 0, head 0: self"
    # Head 0 is the identity: the diagonal is viridis' top colour, the cell left of it the bottom colour.
    assert pixel(page, "viewer", 3, 3) == [0xfd, 0xe7, 0x25]
    assert pixel(page, "viewer", 3, 2) == [0x44, 0x01, 0x54]
    # Switch to head 1 (uniform over the past): the same cell now has weight 1/4, strictly between the two.
    page.select_option("#viewer select[name=head]", "1")
    assert caption.inner_text() == "two heads, layer 0, head 1: uniform"
    assert pixel(page, "viewer", 3, 2) not in ([0xfd, 0xe7, 0x25], [0x44, 0x01, 0x54])
    # Hover the centre of cell (3, 2): the readout names the positions, the tokens and the weight.
    box = page.locator("#viewer canvas").bounding_box()
    cell = float(page.evaluate("document.querySelector('#viewer canvas').dataset.cell"))
    width = float(page.evaluate("document.querySelector('#viewer canvas').width"))
    scale = box["width"] / width
    page.mouse.move(box["x"] + (14 + 2.5 * cell) * scale, box["y"] + (14 + 3.5 * cell) * scale)
    readout = page.locator("#viewer .mha-readout").inner_text()
    assert readout == f'query 3 "{t1[3]}" \u2192 key 2 "{t1[2]}": weight 0.250'
    # The other model has four heads, and its menu says so; its maps are its own.
    page.select_option("#viewer select[name=model]", "1")
    assert page.locator("#viewer select[name=head] option").count() == 4
    assert caption.inner_text().startswith("four heads, layer 0, head ")
    assert page.errors == []
