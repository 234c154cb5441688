"""``attention_explorer``: an interactive attention-map viewer that works in the book's static HTML.

Book: part III, "What heads learn" (attention maps of every head and layer).

The viewer is one self-contained HTML fragment: a ``<script type="application/json">`` block with the weights
(rounded to three decimals, stored as integers in [0, 1000]), a few lines of plain JavaScript, a canvas and three
menus (model, layer, head). Nothing is loaded from anywhere, so it works offline, in a notebook and in the built
book alike. Hovering a cell shows the query and key positions, their tokens and the weight; the panel's caption
shows the head's label (e.g. its class from :func:`mha.analysis.classify_heads`) when one is given.
"""

from __future__ import annotations

import html
import json
import uuid

import numpy as np

from mha._checks import check_int

__all__ = ["AttentionExplorer", "attention_explorer"]

SCALE = 1000  # weights are stored as round(weight * SCALE)

# Matplotlib's viridis at 9 evenly spaced points (0, 1/8, ..., 1); the script interpolates linearly between them.
VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"]

_SCRIPT = """
(function () {
  const root = document.getElementById(%(id)s);
  const data = JSON.parse(root.querySelector('script[type="application/json"]').textContent);
  const canvas = root.querySelector('canvas'), ctx = canvas.getContext('2d');
  const pick = {model: root.querySelector('select[name=model]'), layer: root.querySelector('select[name=layer]'),
                head: root.querySelector('select[name=head]')};
  const caption = root.querySelector('.mha-caption'), readout = root.querySelector('.mha-readout');
  const stops = data.colors.map(c => [1, 3, 5].map(i => parseInt(c.slice(i, i + 2), 16)));
  function color(w) {
    const x = Math.min(Math.max(w, 0), 1) * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2);
    const f = x - i, c = stops[i].map((v, k) => Math.round(v + f * (stops[i + 1][k] - v)));
    return 'rgb(' + c.join(',') + ')';
  }
  function fill(select, labels) {
    const keep = select.value;
    select.innerHTML = '';
    labels.forEach((text, i) => { const o = document.createElement('option'); o.value = i; o.textContent = text;
                                  select.appendChild(o); });
    if (keep !== '' && +keep < labels.length) select.value = keep;
  }
  function current() {
    const m = data.models[+pick.model.value];
    return {m: m, layer: +pick.layer.value, head: +pick.head.value};
  }
  function shown(t) { return t === '\\n' ? '\\u21b5' : t === ' ' ? '\\u2423' : t; }
  const margin = 14;
  function draw() {
    const s = current(), w = s.m.weights[s.layer][s.head], n = s.m.tokens.length;
    const cell = Math.max(4, Math.floor((data.size - margin) / n));
    canvas.width = canvas.height = margin + cell * n;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
      ctx.fillStyle = color(w[i][j] / data.scale);
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
    const longest = Math.max(...s.m.tokens.map(t => shown(t).length));
    if (cell >= 8 && cell >= 6 * longest + 2) {  // labels only where they fit; the readout always names the tokens
      ctx.fillStyle = '#444'; ctx.font = Math.min(cell - 1, 11) + 'px monospace'; ctx.textAlign = 'center';
      for (let i = 0; i < n; i++) {
        ctx.fillText(shown(s.m.tokens[i]), margin + (i + 0.5) * cell, margin - 3);
        ctx.fillText(shown(s.m.tokens[i]), margin / 2, margin + (i + 0.75) * cell);
      }
    }
    const label = s.m.labels ? s.m.labels[s.layer][s.head] : null;
    caption.textContent = s.m.name + ', layer ' + s.layer + ', head ' + s.head + (label ? ': ' + label : '');
    canvas.dataset.cell = cell;
  }
  function refresh() {
    const m = data.models[+pick.model.value];
    fill(pick.layer, m.weights.map((_, i) => 'layer ' + i));
    fill(pick.head, m.weights[+pick.layer.value].map((_, j) => 'head ' + j +
         (m.labels ? ' (' + m.labels[+pick.layer.value][j] + ')' : '')));
    draw();
  }
  fill(pick.model, data.models.map(m => m.name));
  pick.model.addEventListener('change', refresh);
  pick.layer.addEventListener('change', refresh);
  pick.head.addEventListener('change', draw);
  canvas.addEventListener('mousemove', ev => {
    const s = current(), n = s.m.tokens.length, cell = +canvas.dataset.cell, box = canvas.getBoundingClientRect();
    const x = (ev.clientX - box.left) * canvas.width / box.width - margin;
    const y = (ev.clientY - box.top) * canvas.height / box.height - margin;
    const i = Math.floor(y / cell), j = Math.floor(x / cell);
    if (i < 0 || j < 0 || i >= n || j >= n) { readout.textContent = data.hint; return; }
    const w = s.m.weights[s.layer][s.head][i][j] / data.scale;
    readout.textContent = 'query ' + i + ' ' + JSON.stringify(s.m.tokens[i]) + ' \\u2192 key ' + j + ' ' +
      JSON.stringify(s.m.tokens[j]) + ': weight ' + w.toFixed(3) + (j > i ? ' (masked: future position)' : '');
  });
  canvas.addEventListener('mouseleave', () => { readout.textContent = data.hint; });
  refresh();
})();
"""


class AttentionExplorer:
    """The viewer's HTML (``.html``); notebooks and the book display it through ``_repr_html_``."""

    def __init__(self, html_text: str, element_id: str):
        self.html = html_text
        self.element_id = element_id

    def _repr_html_(self) -> str:
        return self.html


def _check_model(name, weights, tokens, labels):
    if not isinstance(name, str) or not name:
        raise TypeError(f"each model name must be a non-empty string, got {name!r}")
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2] or 0 in weights.shape:
        raise ValueError(f"weights of model {name!r} must have shape (n_layers, n_heads, L, L), got {weights.shape}")
    n_layers, n_heads, length, _ = weights.shape
    if not np.isfinite(weights).all():
        raise ValueError(f"weights of model {name!r} must be attention probabilities in [0, 1], got "
                         f"{int((~np.isfinite(weights)).sum())} NaN or infinite value(s)")
    if weights.min() < 0 or weights.max() > 1 + 1e-3:
        raise ValueError(f"weights of model {name!r} must be attention probabilities in [0, 1], got values in "
                         f"[{weights.min():.4g}, {weights.max():.4g}]")
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise TypeError(f"tokens of model {name!r} must be a list of strings (one per position), "
                        f"got {type(tokens).__name__}")
    if len(tokens) != length:
        raise ValueError(f"tokens of model {name!r} must have one string per position: {length}, got {len(tokens)}")
    if labels is not None:
        rows_ok = isinstance(labels, (list, tuple)) and all(isinstance(row, (list, tuple)) for row in labels)
        shape = (len(labels), *{len(row) for row in labels}) if rows_ok else None
        if shape != (n_layers, n_heads) or not all(isinstance(x, str) for row in labels for x in row):
            raise ValueError(f"labels of model {name!r} must be n_layers={n_layers} lists of n_heads={n_heads} "
                             f"strings, got {labels!r:.200}")
    return weights


def attention_explorer(models: dict, size: int = 360, hint: str = "Hover over a cell to read its weight.",
                       element_id: str | None = None) -> AttentionExplorer:
    """An interactive viewer of attention maps: pick a model, a layer and a head; hover a cell for its weight.

    Args:
        models: ``{name: dict(weights=..., tokens=..., labels=None)}``, in display order. ``weights`` is
            (n_layers, n_heads, L, L), each row a query's attention probabilities over the keys (as returned by
            ``TinyTransformer(..., need_weights=True)`` for one sequence, stacked over layers); ``tokens`` is one
            string per position (characters, or token ids as strings); ``labels`` (optional) is one string per
            head, a list of n_layers lists of n_heads strings (e.g. the head's class).
        size: the canvas's width and height in pixels (the cell size is the largest whole number that fits).
        hint: the text shown under the canvas when the pointer is not over a cell.
        element_id: the HTML id of the viewer's container; None draws a fresh random one (two viewers on one
            page need different ids).

    Returns:
        an :class:`AttentionExplorer` (displayed by notebooks; its ``.html`` is a self-contained fragment).

    Book: part III, "What heads learn".
    """
    if not isinstance(models, dict) or not models:
        raise TypeError(f"models must be a non-empty dict {{name: dict(weights, tokens, labels)}}, got {models!r:.100}")
    check_int("size", size, minimum=64)
    element_id = element_id or f"mha-attn-{uuid.uuid4().hex[:12]}"
    if not isinstance(element_id, str) or not element_id.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"element_id must be letters, digits, '-' and '_' only, got {element_id!r}")
    payload_models = []
    for name, spec in models.items():
        if not isinstance(spec, dict) or not {"weights", "tokens"} <= spec.keys() or spec.keys() - {
                "weights", "tokens", "labels"}:
            raise ValueError(f"models[{name!r}] must be a dict with keys 'weights', 'tokens' and optionally "
                             f"'labels', got {type(spec).__name__} {sorted(spec) if isinstance(spec, dict) else ''}")
        weights = _check_model(name, spec["weights"], spec["tokens"], spec.get("labels"))
        payload_models.append(dict(name=name, tokens=list(spec["tokens"]),
                                   weights=np.rint(np.clip(weights, 0, 1) * SCALE).astype(int).tolist(),
                                   labels=None if spec.get("labels") is None else [list(r) for r in spec["labels"]]))
    payload = dict(models=payload_models, scale=SCALE, colors=VIRIDIS, size=size, hint=hint)
    # "<", ">" and "&" escaped so that no token (e.g. "</script>") can end the script element early.
    data = json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")
    menus = "".join(f'<label style="margin-right:0.8em">{what} <select name="{what}"></select></label>'
                    for what in ("model", "layer", "head"))
    html_text = (
        f'<div class="mha-attention-explorer" id="{element_id}" style="font-size:0.85em">'
        f'<div>{menus}</div>'
        f'<div class="mha-caption" style="margin:0.3em 0"></div>'
        f'<canvas role="img" aria-label="attention weights of the chosen head (query down, key across)" '
        f'style="max-width:100%;image-rendering:pixelated;cursor:crosshair"></canvas>'
        f'<div class="mha-readout" style="font-family:monospace;min-height:1.4em">{html.escape(hint)}</div>'
        f'<script type="application/json">{data}</script>'
        f'<script>{_SCRIPT % {"id": json.dumps(element_id)}}</script>'
        f'</div>')
    return AttentionExplorer(html_text, element_id)
