// pyfuser explain report: pan and zoom, tooltips and the details panel (inlined into the page).
// Reads the report's data from <script id="report-data">; every string from it is shown as
// text (textContent), never as HTML.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const svg = document.getElementById("graph");
  const canvas = document.getElementById("canvas");
  const panel = document.getElementById("panel");
  const tip = document.getElementById("tooltip");
  const full = [Number(svg.viewBox.baseVal.x), Number(svg.viewBox.baseVal.y),
    Number(svg.dataset.width), Number(svg.dataset.height)];
  let view = full.slice();

  // ---- small DOM helpers --------------------------------------------------------------------
  function el(tag, props, children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (k === "text") node.textContent = v;
        else if (k === "onclick") node.addEventListener("click", v);
        else node.setAttribute(k, v);
      }
    }
    for (const c of children || []) {
      if (c !== null && c !== undefined) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return node;
  }
  function table(rows) {
    return el("table", null, rows.map(([k, v]) => el("tr", null, [el("th", { text: k }),
      el("td", null, [typeof v === "string" || typeof v === "number" ? String(v) : v])])));
  }
  function bytes(n) {
    const units = [["GB", 1e9], ["MB", 1e6], ["KB", 1e3]];
    for (const [u, s] of units) if (n >= s) return (n / s).toFixed(1) + " " + u;
    return n + " B";
  }
  function fmt(v) {
    if (Array.isArray(v)) return "[" + v.map(fmt).join(", ") + "]";
    if (v !== null && typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function link(label, fn) { return el("button", { class: "link", type: "button", text: label, onclick: fn }); }
  function show(children) {
    panel.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
    panel.scrollTop = 0;
  }

  // ---- selection ------------------------------------------------------------------------------
  function select(node, reveal) {
    for (const s of svg.querySelectorAll(".selected")) s.classList.remove("selected");
    if (node) node.classList.add("selected");
    if (node && reveal) centreOn(node);
  }

  // Move the view so that `node` is in the middle (zooming out when it is larger than the view).
  function centreOn(node) {
    const b = node.getBBox();
    const m = svg.getScreenCTM().inverse().multiply(node.getScreenCTM());
    const x0 = m.a * b.x + m.c * b.y + m.e, y0 = m.b * b.x + m.d * b.y + m.f;
    const x1 = m.a * (b.x + b.width) + m.c * (b.y + b.height) + m.e;
    const y1 = m.b * (b.x + b.width) + m.d * (b.y + b.height) + m.f;
    const f = Math.max(1, (x1 - x0) * 1.1 / view[2], (y1 - y0) * 1.1 / view[3]);
    const w = view[2] * f, h = view[3] * f;
    view = [(x0 + x1) / 2 - w / 2, (y0 + y1) / 2 - h / 2, w, h];
    apply();
  }

  function refusal(v) {
    if (!v.compile_ok) return v.compile_reason || "refused";
    if (v.run_ok === false) return "for these inputs: " + (v.run_reason || "refused");
    return "";
  }

  function showSummary() {
    select(null);
    const s = data.summary;
    const items = [el("h2", { text: "pyfuser explain: " + data.source }),
      table([["frontend", data.frontend], ["device", data.device + " (kernels: " + data.executor + ")"],
        ["groups", s.groups + (s.eager_groups ? " (" + s.eager_groups + " eager)" : "")],
        ["kernels", s.kernels], ["host segments", s.host_segments], ["eager segments", s.eager_segments],
        ["cuts", s.cuts], ["bytes moved by kernels", bytes(s.bytes_moved)],
        ["ops outside the groups", s.fallbacks]])];
    for (const n of data.notes) items.push(el("p", { text: "note: " + n }));
    items.push(el("h3", { text: "groups" }));
    items.push(el("ul", null, data.groups.map((g) => el("li", null, [link(g.name, () => showGroup(g.index, true)),
      " · " + g.segments.length + " segment(s)" + (g.status !== "fused" ? " · runs eagerly" : "")]))));
    if (data.fallbacks.length) {
      items.push(el("h3", { text: "outside the groups" }));
      items.push(el("ul", null, data.fallbacks.map((f, k) => el("li", null,
        [link(f.node, () => showFallback(k, true)), " · " + f.category]))));
    }
    items.push(el("h3", { text: "as text" }));
    items.push(el("pre", { text: data.text }));
    show(items);
  }

  function showGroup(gi, reveal) {
    const g = data.groups[gi];
    select(svg.querySelector('.group[data-group="' + gi + '"]'), reveal);
    const items = [link("← summary", showSummary), el("h2", { text: g.name }),
      table([["status", g.status === "fused" ? "runs through pyfuser" : "runs eagerly: " + g.eager_reason],
        ["inputs", g.inputs.join(", ")], ["outputs", g.outputs.join(", ")],
        ["segments", String(g.segments.length)]])];
    if (g.split_reason) items.push(el("p", { text: "Not one kernel: no scheduler takes all its ops: " + g.split_reason }));
    items.push(el("h3", { text: "segments" }));
    items.push(el("ul", null, g.segments.map((s) => el("li", null, [link("segment " + s.index + ": " + s.kind +
      (s.kernel ? " · " + s.scheduler + " · " + s.kernel.name : ""), () => showSegment(gi, s.index, true))]))));
    if (g.cuts.length) {
      items.push(el("h3", { text: "cuts" }));
      items.push(el("ul", null, g.cuts.map((c, k) => el("li", null, [link(c.tensor, () => showCut(gi, k)),
        " (" + bytes(c.nbytes) + ", segment " + c.from_segment + " → " + c.to_segment + "): " + c.reason]))));
    }
    items.push(el("h3", { text: "ops" }));
    items.push(el("pre", { text: g.ops.join("\n") }));
    items.push(el("h3", { text: "Fusion IR" }));
    items.push(el("pre", { text: g.fusion_ir || "(none)" }));
    show(items);
  }

  function showSegment(gi, si, reveal) {
    const g = data.groups[gi];
    const s = g.segments[si];
    select(svg.querySelector('.segment[data-group="' + gi + '"][data-segment="' + si + '"]'), reveal);
    const items = [link("← " + g.name, () => showGroup(gi)),
      el("h2", { text: "group " + gi + ", segment " + si + ": " + s.kind })];
    if (s.kind === "host") items.push(el("p", { text: "Views on the host: no kernel, no copy." }));
    if (s.kind === "eager") items.push(el("p", { text: "Runs eagerly (reference evaluator): " + s.reason }));
    if (s.error) items.push(el("p", { class: "no", text: s.error }));
    if (s.verdicts.length) {
      items.push(el("h3", { text: "schedulers, in priority order" }));
      items.push(el("ul", null, s.verdicts.map((v) => el("li", { class: v.chosen ? "ok" : (refusal(v) ? "no" : "") },
        [v.scheduler + (v.chosen ? ": chosen" : refusal(v) ? ": refused: " + refusal(v) : ": takes it (ranked lower)")]))));
    }
    const k = s.kernel;
    if (k) {
      const rows = [["kernel", k.name], ["scheduler", k.scheduler],
        ["launch", "grid (" + k.launch.grid.join(", ") + ") block (" + k.launch.block.join(", ") +
          ") shared memory " + k.launch.shared_mem + " B"],
        ["indices", k.index_type],
        ["bytes moved", bytes(k.bytes_in) + " in + " + bytes(k.bytes_out) + " out = " + bytes(k.bytes_in + k.bytes_out)]];
      if (k.bench) {
        rows.push(["time", k.bench.us.toFixed(1) + " µs (same-size copy " + k.bench.copy_us.toFixed(1) + " µs)"]);
        rows.push(["% of copy rate", k.bench.pct_of_copy + "%"]);
      }
      items.push(el("h3", { text: "kernel" }), table(rows));
      items.push(el("h3", { text: "heuristic parameters" }));
      items.push(table(Object.entries(k.params).map(([p, v]) => [p, fmt(v)])));
      items.push(el("h3", { text: "CUDA source" }));
      const code = el("pre", { class: "cuda", text: k.cuda });
      let withPrelude = false;
      const toggle = link("show the prelude too", () => {
        withPrelude = !withPrelude;
        code.textContent = withPrelude ? k.cuda.replace(/^\/\/ \(pyfuser's CUDA prelude[^\n]*\n/m, data.prelude + "\n") : k.cuda;
        toggle.textContent = withPrelude ? "hide the prelude" : "show the prelude too";
      });
      items.push(toggle, code);
    }
    items.push(el("h3", { text: "ops (Fusion IR)" }));
    items.push(el("pre", { text: s.ops.join("\n") }));
    items.push(table([["inputs", s.inputs.join(", ")], ["outputs", s.outputs.join(", ")]]));
    show(items);
  }

  function showCut(gi, ci) {
    const c = data.groups[gi].cuts[ci];
    show([link("← " + data.groups[gi].name, () => showGroup(gi)), el("h2", { text: "cut " + c.tensor }),
      table([["from", "segment " + c.from_segment], ["to", "segment " + c.to_segment],
        ["bytes", bytes(c.nbytes)], ["why", c.reason]])]);
  }

  function showFallback(k, reveal) {
    const f = data.fallbacks[k];
    select(f.ident ? svg.querySelector('[data-node="' + f.ident + '"]') : null, reveal);
    const rows = [["op", f.node], ["category", f.category], ["why", f.reason]];
    if (f.blocker) rows.push(["blocked by", f.blocker.node + ": " + f.blocker.why]);
    else rows.push(["blocked by", "the op itself"]);
    show([link("← summary", showSummary), el("h2", { text: f.kind }), table(rows)]);
  }

  function showNode(g) {
    select(g);
    const title = g.querySelector("title");
    show([link("← summary", showSummary), el("h2", { text: g.querySelector("text").textContent }),
      el("p", { text: title ? title.textContent : "" })]);
  }

  // ---- clicks and tooltips ----------------------------------------------------------------------
  let moved = false;
  svg.addEventListener("click", (ev) => {
    if (moved) return;
    const t = ev.target;
    const cut = t.closest("[data-cut]");
    if (cut) return showCut(Number(cut.dataset.group), Number(cut.dataset.cut));
    const seg = t.closest(".segment");
    if (seg) return showSegment(Number(seg.dataset.group), Number(seg.dataset.segment));
    const grp = t.closest(".group");
    if (grp) return showGroup(Number(grp.dataset.group));
    const node = t.closest(".node");
    if (node) return node.dataset.fallback !== undefined ? showFallback(Number(node.dataset.fallback)) : showNode(node);
    showSummary();
  });

  function tipText(t) {
    const seg = t.closest(".segment");
    if (seg) {
      const s = data.groups[Number(seg.dataset.group)].segments[Number(seg.dataset.segment)];
      if (!s.kernel) return "segment " + s.index + ": " + s.kind + (s.reason ? "\n" + s.reason : "");
      const k = s.kernel;
      let text = k.name + "\n" + k.scheduler + " · grid (" + k.launch.grid.join(", ") + ") block (" +
        k.launch.block.join(", ") + ")\n" + bytes(k.bytes_in + k.bytes_out) + " moved";
      if (k.bench) text += "\n" + k.bench.us.toFixed(1) + " µs · " + k.bench.pct_of_copy + "% of a same-size copy";
      return text + "\nclick for the details and the CUDA source";
    }
    const node = t.closest(".node");
    if (node) {
      const title = node.querySelector("title");
      return title ? title.textContent : "";
    }
    return "";
  }
  svg.addEventListener("mousemove", (ev) => {
    const text = tipText(ev.target);
    if (!text) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 390) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  });
  svg.addEventListener("mouseleave", () => { tip.style.display = "none"; });

  // ---- pan and zoom -------------------------------------------------------------------------------
  function apply() { svg.setAttribute("viewBox", view.map((v) => v.toFixed(1)).join(" ")); }
  function fit() { view = full.slice(); apply(); }
  // First view: the graph's width fills the canvas (at most 1.5x), from the top, so a tall
  // graph starts readable; "fit" shows all of it.
  function initial() {
    const r = svg.getBoundingClientRect();
    if (!r.width || !r.height) return fit();
    const scale = Math.min(r.width / full[2], 1.5);
    const w = r.width / scale, h = r.height / scale;
    view = [full[0] + (full[2] - w) / 2, full[1], w, h];
    apply();
  }
  function zoom(factor, cx, cy) {
    const [x, y, w, h] = view;
    const nw = Math.min(Math.max(w * factor, 40), full[2] * 4);
    const nh = h * (nw / w);
    view = [cx - (cx - x) * (nw / w), cy - (cy - y) * (nh / h), nw, nh];
    apply();
  }
  function toGraph(ev) {
    const r = svg.getBoundingClientRect();
    const scale = Math.max(view[2] / r.width, view[3] / r.height);
    const ox = view[0] + (view[2] - r.width * scale) / 2;
    const oy = view[1] + (view[3] - r.height * scale) / 2;
    return [ox + (ev.clientX - r.left) * scale, oy + (ev.clientY - r.top) * scale, scale];
  }
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const [gx, gy] = toGraph(ev);
    zoom(ev.deltaY > 0 ? 1.15 : 1 / 1.15, gx, gy);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, view: view.slice(), scale: toGraph(ev)[2] };
    moved = false;
  });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { moved = true; canvas.classList.add("dragging"); }
    view = [drag.view[0] - dx * drag.scale, drag.view[1] - dy * drag.scale, drag.view[2], drag.view[3]];
    apply();
  });
  window.addEventListener("mouseup", () => {
    drag = null;
    canvas.classList.remove("dragging");
    setTimeout(() => { moved = false; }, 0);
  });
  document.getElementById("fit").addEventListener("click", fit);
  document.getElementById("zoom-in").addEventListener("click", () => zoom(1 / 1.3, view[0] + view[2] / 2, view[1] + view[3] / 2));
  document.getElementById("zoom-out").addEventListener("click", () => zoom(1.3, view[0] + view[2] / 2, view[1] + view[3] / 2));

  // ---- search -------------------------------------------------------------------------------------
  document.getElementById("search").addEventListener("input", (ev) => {
    const q = ev.target.value.trim().toLowerCase();
    for (const m of svg.querySelectorAll(".match")) m.classList.remove("match");
    if (!q) return;
    for (const g of data.groups) {
      if (g.ops.some((op) => op.toLowerCase().includes(q))) {
        const box = svg.querySelector('.group[data-group="' + g.index + '"]');
        if (box) box.classList.add("match");
      }
    }
    for (const n of svg.querySelectorAll(".node, .expr")) {
      if (n.querySelector("text").textContent.toLowerCase().includes(q)) n.classList.add("match");
    }
  });

  initial();
  showSummary();
})();
