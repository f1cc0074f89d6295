"""A small layered layout for drawing dataflow graphs top to bottom (the HTML report).

    pos = layered(sizes, edges, bands=None, gap_x=24, gap_y=36) -> {id: (x, y)}, width, height

`sizes` maps each node id to (width, height), in the order the graph lists them; `edges` are
(from, to) pairs. Layers: the longest path from the sources (a source is then moved down to
just above its first user, so a graph input used late sits next to it); `bands` (id -> band
number, nondecreasing along edges) keeps every node of band k below every node of band k-1,
which is how the segments of a fusion group become horizontal stripes. Within a layer, nodes
are ordered by the mean position of their neighbours (a few sweeps down and up), then placed
left to right near the mean x of their parents, never overlapping. (x, y) is a node's top-left
corner; width and height enclose everything. Deterministic: same input, same picture.
`band_rows(pos, sizes, bands)` gives the y range of each band for drawing the stripes.
"""
from __future__ import annotations


def _layers(ids, edges, bands):
    preds = {i: [] for i in ids}
    succs = {i: [] for i in ids}
    for a, b in edges:
        if a in preds and b in preds and a != b:
            succs[a].append(b)
            preds[b].append(a)
    order = {i: k for k, i in enumerate(ids)}
    # topological order (Kahn, ties by listing order); what a cycle leaves goes last
    indeg = {i: len(preds[i]) for i in ids}
    ready = sorted((i for i in ids if indeg[i] == 0), key=order.get)
    topo = []
    while ready:
        i = ready.pop(0)
        topo.append(i)
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
                ready.sort(key=order.get)
    placed = set(topo)
    topo += [i for i in ids if i not in placed]
    pos_in_topo = {i: k for k, i in enumerate(topo)}
    layer = {}
    for i in topo:
        layer[i] = max((layer[p] + 1 for p in preds[i] if pos_in_topo[p] < pos_in_topo[i]),
                       default=0)
    if bands:
        start = 0
        for band in sorted(set(bands.values())):
            members = [i for i in topo if bands.get(i) == band]
            for i in members:                      # rebuild this band's layers from `start`
                layer[i] = max([start] + [layer[p] + 1 for p in preds[i]
                                          if pos_in_topo[p] < pos_in_topo[i]])
            if members:
                start = max(layer[i] for i in members) + 1
    else:
        for i in reversed(topo):                   # sources just above their first user
            if not preds[i] and succs[i]:
                layer[i] = max(layer[i], min(layer[s] for s in succs[i]) - 1)
    return layer, preds, succs


def layered(sizes: dict, edges, bands: dict | None = None, gap_x: float = 24,
            gap_y: float = 36):
    ids = list(sizes)
    if not ids:
        return {}, 0, 0
    layer, preds, succs = _layers(ids, edges, bands)
    n_layers = max(layer.values()) + 1
    rows = [[] for _ in range(n_layers)]
    for i in ids:
        rows[layer[i]].append(i)
    rank = {}
    for row in rows:
        for k, i in enumerate(row):
            rank[i] = k

    def sweep(rows_iter, neighbours):
        for row in rows_iter:
            def key(i):
                ns = [rank[n] for n in neighbours[i]]
                return (sum(ns) / len(ns)) if ns else rank[i]
            row.sort(key=lambda i: (key(i), rank[i]))
            for k, i in enumerate(row):
                rank[i] = k

    for _ in range(4):
        sweep(rows[1:], preds)
        sweep(reversed(rows[:-1]), succs)
    x, y = {}, {}
    top = 0.0
    for row in rows:
        h = max((sizes[i][1] for i in row), default=0)
        for i in row:
            y[i] = top
        top += h + gap_y
    for row in rows:                                # left to right near the parents' mean x
        cursor = 0.0
        for i in row:
            want = [x[p] + sizes[p][0] / 2 for p in preds[i] if p in x]
            centre = sum(want) / len(want) if want else cursor + sizes[i][0] / 2
            x[i] = max(cursor, centre - sizes[i][0] / 2)
            cursor = x[i] + sizes[i][0] + gap_x
    width = max(x[i] + sizes[i][0] for i in ids)
    for row in rows:                                # centre rows that have no parents placed
        if row and all(not preds[i] for i in row):
            used = x[row[-1]] + sizes[row[-1]][0] - x[row[0]]
            shift = max(0.0, (width - used) / 2 - x[row[0]])
            for i in row:
                x[i] += shift
    height = max(y[i] + sizes[i][1] for i in ids)
    return {i: (x[i], y[i]) for i in ids}, width, height


def band_rows(pos: dict, sizes: dict, bands: dict) -> dict:
    """band -> (top, bottom) of its nodes."""
    out: dict = {}
    for i, band in bands.items():
        top, bottom = pos[i][1], pos[i][1] + sizes[i][1]
        if band in out:
            t, b = out[band]
            out[band] = (min(t, top), max(b, bottom))
        else:
            out[band] = (top, bottom)
    return out
