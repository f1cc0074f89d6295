"""The HTML view of an Explanation: one self-contained page (no server, no network).

    page = render(explanation)

The graph is drawn as inline SVG, laid out here (layout.py): the graph's inputs, the ops left
outside the groups (fallbacks in red, ops with no lowering in amber, views in grey), one box per
fusion group in its own colour, and inside each group its segments as horizontal stripes in run
order (kernel stripes coloured by scheduler, host stripes grey, eager stripes red) holding the
group's Fusion IR exprs, with the tensors the segmenter cut drawn dashed. The page's script
(assets/report.js, inlined with assets/report.css) adds pan and zoom, a tooltip with each
kernel's figures on hover, and on click a side panel: a group's ops and cuts, a kernel's
scheduler verdicts, parameters, launch configuration, bytes, timing and CUDA source, a fallback's
reason and blocker. The Explanation's data is embedded as JSON (`as_dict`, plus the CUDA
prelude once); every string the page shows from it is set as text, never parsed as HTML.

Invariant: the page references nothing outside itself (no URL, font, script or style to fetch).
"""
from __future__ import annotations

import html
import json
import os

from .layout import band_rows, layered

CHAR_W, FONT_PX = 7.0, 12          # monospace advance width and size of labels
NODE_H, EXPR_H = 26, 22
GROUP_PAD, GROUP_HEAD, BAND_HEAD = 10, 24, 18
SCHEDULER_CLASS = {"pointwise": "pw", "transpose": "tr", "reduction": "rd",
                   "inner_persistent": "ip", "outer_persistent": "op"}
_ASSETS = os.path.join(os.path.dirname(__file__), "assets")


def _asset(name: str) -> str:
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as f:
        return f.read()


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def _label(s: str, limit: int = 28) -> str:
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _text_w(s: str) -> float:
    return len(s) * CHAR_W + 16


def _parse_op(op: str):
    """(outputs, op name, inputs) of an expr line "T3 = add(T1, T2)"."""
    lhs, _, rhs = op.partition(" = ")
    name, _, args = rhs.partition("(")
    outs = [v.strip() for v in lhs.split(",") if v.strip()]
    ins = [v.strip() for v in args.rstrip(")").split(",") if v.strip()]
    return outs, name.strip(), ins


# ---- a group's inside: its exprs, banded by segment ---------------------------------------------
class _GroupDrawing:
    def __init__(self, g):
        self.g = g
        self.sizes, self.labels, self.band, self.seg_of = {}, {}, {}, {}
        producer, self.edges = {}, []
        k = 0
        for s in g.segments:
            for op in s.ops:
                outs, name, ins = _parse_op(op)
                ident = f"g{g.index}e{k}"
                k += 1
                self.sizes[ident] = (_text_w(_label(name, 20)), EXPR_H)
                self.labels[ident] = (name, op)
                self.band[ident] = s.index
                for v in ins:
                    if v in producer:
                        self.edges.append((producer[v], ident, v))
                for v in outs:
                    producer[v] = ident
        self.cut_names = {c.tensor: i for i, c in enumerate(g.cuts)}
        if self.sizes:
            self.pos, w, _ = layered(self.sizes, [(a, b) for a, b, _ in self.edges],
                                     self.band, gap_x=14, gap_y=22)
            order = sorted(set(self.band.values()))
            shift = {b: BAND_HEAD * (r + 1) + 6 * r for r, b in enumerate(order)}
            self.pos = {i: (x + GROUP_PAD, y + shift[self.band[i]] + GROUP_HEAD)
                        for i, (x, y) in self.pos.items()}
            rows = band_rows(self.pos, self.sizes, self.band)
            self.rows = {b: (t - BAND_HEAD, bot + 4) for b, (t, bot) in rows.items()}
            head_w = max(_text_w(self._band_title(s)) for s in g.segments)
            self.width = max(w, head_w, _text_w(self.title())) + 2 * GROUP_PAD
            self.height = max(bot for _, bot in self.rows.values()) + GROUP_PAD
        else:
            self.pos, self.rows = {}, {}
            self.width = max(_text_w(self.title()), _text_w(self.status_line())) + 2 * GROUP_PAD
            self.height = GROUP_HEAD + 30

    def title(self) -> str:
        n_k = sum(s.kind == "kernel" for s in self.g.segments)
        return f"group {self.g.index} · {len(self.g.segments)} segment(s) · {n_k} kernel(s)"

    def status_line(self) -> str:
        return "runs eagerly" if self.g.status != "fused" else "no kernel outputs"

    @staticmethod
    def _band_title(s) -> str:
        if s.kind == "kernel":
            sched = s.scheduler or s.segmenter_scheduler or "?"
            return f"{s.index} · kernel · {sched}"
        return f"{s.index} · {s.kind}"

    def svg(self, ox: float, oy: float) -> str:
        g = self.g
        hue = (g.index * 137.508) % 360
        cls = "group" + (" eager-group" if g.status != "fused" else "")
        out = [f'<g class="{cls}" data-group="{g.index}" transform="translate({ox:.1f},{oy:.1f})" '
               f'style="--hue:{hue:.0f}">',
               f'<rect class="group-box" width="{self.width:.1f}" height="{self.height:.1f}" '
               f'rx="8"/>',
               f'<text class="group-title" x="{GROUP_PAD}" y="17">{_esc(self.title())}</text>']
        if not g.segments:
            out.append(f'<text class="group-status" x="{GROUP_PAD}" y="{GROUP_HEAD + 18}">'
                       f'{_esc(self.status_line())}</text>')
        inner_w = self.width - 2 * GROUP_PAD + 8
        for s in g.segments:
            top, bot = self.rows.get(s.index, (0, 0))
            kind = s.kind if s.kind != "kernel" else \
                "kernel " + SCHEDULER_CLASS.get(s.scheduler or s.segmenter_scheduler or "", "")
            out.append(f'<g class="segment {kind}" data-group="{g.index}" '
                       f'data-segment="{s.index}">')
            out.append(f'<rect class="segment-box" x="{GROUP_PAD - 4}" y="{top:.1f}" '
                       f'width="{inner_w:.1f}" height="{bot - top:.1f}" rx="5"/>')
            out.append(f'<text class="segment-title" x="{GROUP_PAD}" y="{top + 13:.1f}">'
                       f'{_esc(self._band_title(s))}</text>')
            for ident, band in self.band.items():
                if band != s.index:
                    continue
                x, y = self.pos[ident]
                w, h = self.sizes[ident]
                name, op = self.labels[ident]
                out.append(f'<g class="expr"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                           f'height="{h}" rx="3"/><text x="{x + w / 2:.1f}" y="{y + 15:.1f}">'
                           f'{_esc(_label(name, 20))}</text><title>{_esc(op)}</title></g>')
            out.append("</g>")
        for a, b, tensor in self.edges:
            (xa, ya), (xb, yb) = self.pos[a], self.pos[b]
            wa, ha = self.sizes[a]
            wb, _ = self.sizes[b]
            cls, extra = "edge inner", ""
            if self.band[a] != self.band[b]:
                cls += " cross"
                if tensor in self.cut_names:
                    cls += " cut"
                    extra = f' data-group="{g.index}" data-cut="{self.cut_names[tensor]}"'
            out.append(f'<path class="{cls}"{extra} d="{_curve(xa + wa / 2, ya + ha, xb + wb / 2, yb)}">'
                       f'<title>{_esc(tensor)}</title></path>')
            if extra:                      # a label to see and click: the tensor went to memory
                mx, my = (xa + wa / 2 + xb + wb / 2) / 2, (ya + ha + yb) / 2
                out.append(f'<text class="cut-label"{extra} x="{mx + 4:.1f}" y="{my + 4:.1f}">'
                           f'✂ {_esc(tensor)}</text>')
        out.append("</g>")
        return "\n".join(out)


def _curve(x1, y1, x2, y2) -> str:
    dy = max(12.0, (y2 - y1) / 2)
    return (f"M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + dy:.1f} {x2:.1f},{y2 - dy:.1f} "
            f"{x2:.1f},{y2:.1f}")


# ---- the whole graph ------------------------------------------------------------------------------
def _picture(e):
    """The Picture to draw: the frontend's, or inputs -> each group -> outputs."""
    from .model import Picture, PictureNode
    if e.picture is not None:
        return e.picture
    pic = Picture()
    pic.nodes.append(PictureNode("in", "inputs", "input"))
    pic.nodes += [PictureNode(f"g{g.index}", g.name, "group", group=g.index) for g in e.groups]
    pic.nodes.append(PictureNode("out", "outputs", "output"))
    for g in e.groups:
        pic.edges += [("in", f"g{g.index}"), (f"g{g.index}", "out")]
    return pic


def graph_svg(e):
    """(svg markup, width, height) of the whole picture."""
    pic = _picture(e)
    groups = {g.index: _GroupDrawing(g) for g in e.groups}
    sizes, nodes = {}, {}
    for n in pic.nodes:
        nodes[n.ident] = n
        if n.kind == "group" and n.group in groups:
            d = groups[n.group]
            sizes[n.ident] = (d.width, d.height)
        else:
            sizes[n.ident] = (_text_w(_label(n.label)), NODE_H)
    pos, width, height = layered(sizes, pic.edges, gap_x=28, gap_y=40)
    fb_of = {f.ident: i for i, f in enumerate(e.fallbacks) if f.ident}
    parts = []
    for a, b in pic.edges:
        if a not in pos or b not in pos:
            continue
        (xa, ya), (xb, yb) = pos[a], pos[b]
        parts.append(f'<path class="edge" data-from="{_esc(a)}" data-to="{_esc(b)}" '
                     f'd="{_curve(xa + sizes[a][0] / 2, ya + sizes[a][1], xb + sizes[b][0] / 2, yb)}"/>')
    for ident, n in nodes.items():
        x, y = pos[ident]
        if n.kind == "group" and n.group in groups:
            parts.append(groups[n.group].svg(x, y))
            continue
        w, h = sizes[ident]
        attrs = f' data-fallback="{fb_of[ident]}"' if ident in fb_of else ""
        mark = "⚠ " if n.kind == "fallback" else ""
        parts.append(f'<g class="node {n.kind}" data-node="{_esc(ident)}"{attrs} '
                     f'transform="translate({x:.1f},{y:.1f})"><rect width="{w:.1f}" height="{h}" '
                     f'rx="{h / 2 if n.kind in ("input", "output") else 4}"/>'
                     f'<text x="{w / 2:.1f}" y="17">{_esc(mark + _label(n.label))}</text>'
                     f'<title>{_esc(n.title or n.label)}</title></g>')
    return "\n".join(parts), width, height


def _json_for_script(data) -> str:
    """JSON safe inside <script>: no '</' (closing tags), no U+2028/9 line separators."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(e) -> str:
    body, width, height = graph_svg(e)
    data = e.as_dict(prelude=True)
    data["text"] = e.text()
    s = e.summary()
    title = f"pyfuser explain: {e.source}"
    head = (f"{s['groups']} group(s), {s['kernels']} kernel(s), {s['host_segments']} host "
            f"segment(s), {s['eager_segments']} eager segment(s), {s['cuts']} cut(s), "
            f"{s['fallbacks']} op(s) outside the groups · {e.frontend} on {e.device}")
    pad = 20
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}</title>
<style>
{_asset("report.css")}
</style>
</head>
<body>
<header>
<h1>{_esc(title)}</h1>
<p id="summary">{_esc(head)}</p>
<div id="toolbar">
<input id="search" type="search" placeholder="find an op (e.g. gelu, linear)" aria-label="find an op">
<button id="fit" type="button">fit</button>
<button id="zoom-in" type="button">+</button>
<button id="zoom-out" type="button">−</button>
<span class="legend"><i class="k pw"></i>pointwise <i class="k tr"></i>transpose <i class="k rd"></i>reduction
<i class="k ip"></i>inner persistent <i class="k op"></i>outer persistent <i class="k host"></i>host views
<i class="k eager"></i>eager segment <i class="k fb"></i>not fused <i class="k nl"></i>no lowering</span>
</div>
</header>
<main>
<div id="canvas">
<svg id="graph" viewBox="{-pad} {-pad} {width + 2 * pad:.0f} {height + 2 * pad:.0f}" data-width="{width + 2 * pad:.0f}" data-height="{height + 2 * pad:.0f}">
<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>
{body}
</svg>
</div>
<aside id="panel" aria-live="polite"></aside>
</main>
<div id="tooltip" role="tooltip"></div>
<script type="application/json" id="report-data">{_json_for_script(data)}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""
