"""The HTML page of ``hotcompile diff --html``: one self-contained file, no network.

Reports get attached to issues and opened on air-gapped machines, so everything (CSS, the
little JS for filtering by layer and hiding unchanged lines) is inline and nothing is fetched.
The graphs are shown side by side, aligned with :mod:`difflib` so the same line sits on the
same row in both columns.
"""

from __future__ import annotations

import difflib
import html
from typing import Any

from hotcompile.diffdata import REWRITTEN, GraphDiffData, SavedValue, human_bytes

_CSS = """
:root { --bg:#fff; --fg:#1d2330; --mut:#6b7280; --line:#e5e7eb; --add:#e6ffec; --addfg:#116329;
        --del:#ffebe9; --delfg:#a40e26; --warn:#fff8c5; --head:#f6f8fa; --acc:#0969da; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--fg); background: var(--bg); }
header { padding: 14px 24px; border-bottom: 1px solid var(--line); background: var(--head); }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px; }
h3 { font-size: 14px; margin: 14px 0 6px; color: var(--mut); }
main { padding: 0 24px 40px; }
.cards { display: flex; gap: 12px; margin-top: 10px; flex-wrap: wrap; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 6px 12px; background: #fff; }
.card b { display: block; font-size: 18px; }
.card span { color: var(--mut); font-size: 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 8px; text-align: left;
         vertical-align: top; }
th { background: var(--head); font-weight: 600; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .code { font: 12px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.pill { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px;
        border: 1px solid var(--line); }
.p-hot, .p-gx_only { background: var(--add); color: var(--addfg); }
.p-skipped, .p-not { background: var(--warn); }
.p-exact, .p-fp8_forward { background: #ddf4ff; }
.flag { color: var(--delfg); } .ok { color: var(--addfg); }
tr.layer-row { cursor: pointer; } tr.layer-row:hover, tr.sel { background: #f0f6ff; }
.grid2 { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 16px; }
.grid2 table td, .grid2 table th { padding: 2px 6px; font-size: 12px; }
.grid2 code { word-break: break-all; }
td.num { white-space: nowrap; }
.side { width: 100%; table-layout: fixed; }
.side td { padding: 0 6px; border: none; white-space: pre-wrap; word-break: break-all; }
.side td.ln { width: 50%; }
.side tr.eq td { color: #57606a; }
.side td.del { background: var(--del); color: var(--delfg); }
.side td.add { background: var(--add); color: var(--addfg); }
.side td.gap { background: repeating-linear-gradient(45deg,#fafafa,#fafafa 4px,#f0f0f0 4px,
               #f0f0f0 8px); }
.side th { font-size: 12px; }
.hl td { outline: 2px solid #ffd33d; outline-offset: -2px; }
.hide-eq tr.eq { display: none; }
.controls { margin: 8px 0; display: flex; gap: 14px; align-items: center; color: var(--mut); }
.scroll { max-height: 560px; overflow: auto; border: 1px solid var(--line); border-radius: 6px; }
tr.gone td { background: var(--del); } tr.new td { background: var(--add); }
.muted { color: var(--mut); }
"""

_JS = """
function pick(layer) {
  document.querySelectorAll('tr.sel').forEach(r => r.classList.remove('sel'));
  document.querySelectorAll('.hl').forEach(r => r.classList.remove('hl'));
  const sel = document.getElementById('layer-filter');
  if (sel.value !== layer) sel.value = layer;
  if (!layer) return;
  document.querySelectorAll('tr.layer-row[data-layer="' + layer + '"]')
    .forEach(r => r.classList.add('sel'));
  let first = null;
  document.querySelectorAll('.side tr[data-layers]').forEach(r => {
    if (r.dataset.layers.split(' ').includes(layer)) { r.classList.add('hl'); first ||= r; }
  });
  if (first) first.scrollIntoView({block: 'center'});
}
document.querySelectorAll('tr.layer-row').forEach(r =>
  r.addEventListener('click', () => pick(r.dataset.layer)));
document.getElementById('layer-filter').addEventListener('change', e => pick(e.target.value));
document.getElementById('only-changes').addEventListener('change', e =>
  document.querySelectorAll('.side').forEach(t => t.classList.toggle('hide-eq', e.target.checked)));
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _layer_of_line(line: str) -> str:
    """``fc1.addmm: ...`` -> ``fc1`` (the normalised name starts with the layer path)."""
    name = line.split(":", 1)[0].split("[", 1)[0]
    return name.rsplit(".", 1)[0] if "." in name else ""


def _side_by_side(before: list[str], after: list[str], title: str) -> str:
    rows = []
    sm = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for a in before[i1:i2]:
                lay = _e(_layer_of_line(a))
                rows.append(
                    f'<tr class="eq" data-layers="{lay}"><td class="ln code">{_e(a)}</td>'
                    f'<td class="ln code">{_e(a)}</td></tr>'
                )
            continue
        left, right = before[i1:i2], after[j1:j2]
        for k in range(max(len(left), len(right))):
            a = left[k] if k < len(left) else None
            b = right[k] if k < len(right) else None
            layers = " ".join(sorted({_layer_of_line(x) for x in (a, b) if x is not None}))
            ca = (
                f'<td class="ln code del">{_e(a)}</td>'
                if a is not None
                else '<td class="gap"></td>'
            )
            cb = (
                f'<td class="ln code add">{_e(b)}</td>'
                if b is not None
                else '<td class="gap"></td>'
            )
            rows.append(f'<tr data-layers="{_e(layers)}">{ca}{cb}</tr>')
    return (
        f"<h3>{_e(title)}</h3><div class='scroll'><table class='side'>"
        "<thead><tr><th>plain torch.compile</th><th>backend=&quot;hot&quot;</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _saved_table(rows: list[SavedValue], other: set[str], gone_cls: str) -> str:
    body = []
    for s in rows:
        cls = "" if s.name in other else gone_cls
        body.append(
            f'<tr class="{cls}"><td><code>{_e(s.name)}</code></td><td>{_e(s.layer or "-")}</td>'
            f"<td><code>{_e('x'.join(map(str, s.shape)) or 'scalar')}</code></td>"
            f"<td>{_e(s.dtype)}</td><td class='num'>{_e(human_bytes(s.bytes))}</td>"
            f"<td>{_e(s.role)}</td><td>{'yes' if s.compressed else 'no'}</td></tr>"
        )
    return (
        "<table><thead><tr><th>name</th><th>layer</th><th>shape</th><th>dtype</th>"
        "<th>bytes</th><th>role</th><th>compressed</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _changes(ch: dict[str, int]) -> str:
    if not ch:
        return "<span class='muted'>unchanged</span>"
    parts = []
    for k, v in ch.items():
        cls = "ok" if v > 0 else "flag"
        parts.append(f"<span class='{cls}'>{'+' if v > 0 else ''}{v}&nbsp;{_e(k)}</span>")
    return " ".join(parts)


def render_html(d: GraphDiffData) -> str:
    """The whole report as one HTML string."""
    sb = d.saved_bytes()
    b, a = sb["before"]["activations"], sb["after"]["activations"]
    shapes = ", ".join("x".join(map(str, i.get("shape", []))) or "?" for i in d.inputs)
    cards = [
        (human_bytes(b), "saved activations, plain"),
        (human_bytes(a), "saved activations, hot"),
        (f"{a / b:.2f}x" if b else "-", "hot / plain"),
        (human_bytes(sb["after"]["compressed"]), "of which INT8 compressed"),
        (
            f"{sum(lay.path in REWRITTEN for lay in d.layers)}/{len(d.layers)}",
            "layers rewritten",
        ),
        (str(len(d.flagged)), "layers still saving full-precision x"),
    ]
    card_html = "".join(
        f"<div class='card'><b>{_e(v)}</b><span>{_e(k)}</span></div>" for v, k in cards
    )
    notes = "".join(f"<p class='flag'>note: {_e(n)}</p>" for n in d.notes)

    layer_rows = []
    for lay in d.layers:
        pcls = "p-" + lay.path.split()[0]
        flag = (
            f"<span class='flag'>&#9888; x saved: {_e(lay.input_saved_reason)}</span>"
            if lay.flagged
            else "<span class='ok'>compressed / not needed</span>"
        )
        saved = (
            f"<code>{_e(', '.join(lay.saved_before) or '-')}</code> &rarr; "
            f"<code>{_e(', '.join(lay.saved_after) or '-')}</code>"
        )
        layer_rows.append(
            f'<tr class="layer-row" data-layer="{_e(lay.name)}">'
            f"<td><code>{_e(lay.name)}</code></td><td>{_e(lay.kind)}</td>"
            f"<td><span class='pill {pcls}'>{_e(lay.path)}</span>"
            f"{('<br><span class=muted>' + _e(lay.reason) + '</span>') if lay.reason else ''}"
            f"</td><td>{_e(lay.quantizer or '-')}<br><span class='muted'>"
            f"{_e(lay.quantizer_rule or '')}</span></td>"
            f"<td>{_changes(lay.op_changes('forward'))}</td>"
            f"<td>{_changes(lay.op_changes('backward'))}</td>"
            f"<td>{saved}</td><td>{flag}</td></tr>"
        )
    options = "".join(f"<option>{_e(lay.name)}</option>" for lay in d.layers)

    graph_html = []
    for g in d.graphs:
        before_names = {s.name for s in g.saved_before}
        after_names = {s.name for s in g.saved_after}
        gb, ga = sum(s.bytes for s in g.saved_before), sum(s.bytes for s in g.saved_after)
        graph_html.append(
            f"<h2>Graph {g.index}: saved for the backward</h2>"
            "<div class='grid2'>"
            f"<div><h3>plain ({_e(human_bytes(gb))} incl. parameters)</h3>"
            f"{_saved_table(g.saved_before, after_names, 'gone')}</div>"
            f"<div><h3>hot ({_e(human_bytes(ga))} incl. parameters)</h3>"
            f"{_saved_table(g.saved_after, before_names, 'new')}</div></div>"
            f"<h2>Graph {g.index}: forward and backward, side by side</h2>"
            + _side_by_side(g.fw_before, g.fw_after, "forward (AOT, decomposed)")
            + _side_by_side(g.bw_before, g.bw_after, "backward (AOT, decomposed)")
        )

    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hotcompile diff: {_e(d.model)}</title>
<style>{_CSS}</style>
</head>
<body>
<header>
<h1>hotcompile diff: <code>{_e(d.model)}</code></h1>
<div class="muted">inputs [{_e(shapes)}] &middot; plain torch.compile vs backend="hot", both
through AOTAutograd with inductor's decompositions and the min-cut partitioner</div>
<div class="cards">{card_html}</div>
{notes}
</header>
<main>
<h2>Layers</h2>
<div class="controls">
<label>highlight layer <select id="layer-filter"><option value="">(none)</option>{options}
</select></label>
<label><input type="checkbox" id="only-changes"> only changed lines</label>
<span>click a row to find its nodes in the graphs</span>
</div>
<table>
<thead><tr><th>layer</th><th>kind</th><th>path</th><th>g_x quantizer / rule</th>
<th>forward ops</th><th>backward ops</th><th>saved (plain &rarr; hot)</th>
<th>full-precision input</th></tr></thead>
<tbody>{"".join(layer_rows)}</tbody>
</table>
{"".join(graph_html)}
</main>
<script>{_JS}</script>
</body>
</html>
"""
