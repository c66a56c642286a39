"""The HTML report's style sheet and script, inlined into every ``report.html`` (no network, no CDN).

The script does four things and nothing else: sorts a table when its header is clicked or, focused, gets
Enter or Space (``aria-sort`` on the sorted header); orders a data set's task picker worst first by the
chosen metric (each option's ``data-m`` holds its task's means over methods, the picker's
``data-metrics`` and ``data-directions`` name them) and narrows it to the tasks whose name holds the
filter box's text; shows the task chosen (also from the address's ``#task=NAME``, so a link can point
at one attribute; a clicked link scrolls to it); and marks the page ready (``data-report-ready`` on
``<html>``) once it ran to the end, which the browser test reads.
"""

from __future__ import annotations

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fff}
header{background:#f4f5f7;border-bottom:1px solid #ddd;padding:14px 24px}
header h1{margin:0 0 4px;font-size:22px}
header p{margin:2px 0;color:#555}
nav a{margin-right:14px}
main{padding:8px 24px 40px;max-width:1700px}
h2{border-bottom:2px solid #4c72b0;padding-bottom:3px;margin-top:32px}
h3{margin:24px 0 6px}
p.note{color:#555;max-width:1000px;margin:4px 0 8px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom;min-width:3.5em}
td .sd{display:block;font-size:11px;color:#666}
th:first-child,td:first-child{text-align:left}
td.l,th.l{text-align:left}
thead th{background:#f4f5f7;position:sticky;top:0}
table.sortable thead th{cursor:pointer;user-select:none}
table.sortable thead th:focus-visible{outline:2px solid #0072B2;outline-offset:-2px}
table.sortable thead th:after{content:" \\2195";color:#aaa;font-size:11px}
table.sortable thead th[aria-sort=ascending]:after{content:" \\25B2";color:#333}
table.sortable thead th[aria-sort=descending]:after{content:" \\25BC";color:#333}
tr.top td{font-weight:600;background:#fff8e1}
tr.bad td{background:#fdecea}
.variant{color:#1b7e3c;font-weight:600}.counterpart{color:#b3261e;font-weight:600}.inconclusive{color:#777}
.picker{display:flex;gap:8px;align-items:center;margin:8px 0;flex-wrap:wrap}
.picker select{font-size:14px;padding:2px 4px;max-width:360px}
.picker input{font-size:14px;padding:2px 4px;width:12em}
.picker .count{font-weight:600}.picker .hint{color:#777}
.diagrams,.charts{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:flex-start}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0}
.legend span svg{vertical-align:-1px;margin-right:3px}
.scroll{overflow-x:auto;max-width:100%}
svg text{font:10px system-ui,sans-serif;fill:#333}
svg text.t{font-size:12px;font-weight:600}
svg text.s{font-size:11px;fill:#555}
svg .frame{fill:none;stroke:#bbb}
svg .bar{fill:#4c72b0}
svg .gap{fill:url(#hatch);stroke:#c44e52;stroke-width:.6}
svg .cnt{fill:#999}
svg .diag{stroke:#555;stroke-dasharray:4 3;stroke-width:1}
svg .truth{fill:#000}
svg .grid{stroke:#eee}
svg .band{fill:#f6f7f9}
svg .front{fill:none;stroke:#f0c419;stroke-width:7;stroke-linecap:round;stroke-linejoin:round;opacity:.7}
svg a text{fill:#0b57d0}
"""

SCRIPT = """
(function () {
  "use strict";
  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var v = cell.getAttribute("data-v");
    return v === null ? cell.textContent.trim() : v;
  }
  function sortBy(table, index, th) {
    var body = table.tBodies[0];
    var ascending = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      var nx = parseFloat(x), ny = parseFloat(y);
      var numeric = x !== "" && y !== "" && !isNaN(nx) && !isNaN(ny);
      var order = numeric ? nx - ny : x.localeCompare(y);
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
      th.addEventListener("click", function () { sortBy(table, index, th); });
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " " || event.key === "Spacebar") {
          event.preventDefault();  // Space would scroll the page
          sortBy(table, index, th);
        }
      });
    });
  });
  function show(view, task) {
    var found = false;
    view.querySelectorAll(".task-panel").forEach(function (panel) {
      var match = panel.getAttribute("data-task") === task;
      panel.hidden = !match;
      found = found || match;
    });
    if (found) {
      var select = view.querySelector("select.task");
      if (!Array.prototype.some.call(select.options, function (o) { return o.value === task; })) {
        view.querySelector("input.filter").value = "";  // a linked task hidden by the filter: clear it
        arrange(view);
      }
      select.value = task;
      view.setAttribute("data-shown", task);
    }
    return found;
  }
  function arrange(view) {
    // the picker's options: pinned first, then worst first by the chosen metric (no value last), filtered
    var picker = view.querySelector(".picker");
    var select = picker.querySelector("select.task");
    var metrics = (picker.getAttribute("data-metrics") || "").split(" ");
    var directions = (picker.getAttribute("data-directions") || "").split(" ");
    var metric = picker.querySelector("select.order").value;
    var column = metrics.indexOf(metric);
    var needle = picker.querySelector("input.filter").value.trim().toLowerCase();
    if (!view.allOptions) view.allOptions = Array.prototype.slice.call(select.options);
    var shown = view.allOptions.filter(function (o) {
      return o.hasAttribute("data-pin") || needle === "" || o.value.toLowerCase().indexOf(needle) >= 0;
    });
    function score(o) {
      var text = (o.getAttribute("data-m") || "").split(" ")[column];
      var v = parseFloat(text);
      return isNaN(v) ? null : v * parseFloat(directions[column]);
    }
    shown.sort(function (a, b) {
      var pin = (b.hasAttribute("data-pin") ? 1 : 0) - (a.hasAttribute("data-pin") ? 1 : 0);
      if (pin !== 0) return pin;
      if (column < 0) return a.value.localeCompare(b.value);
      var x = score(a), y = score(b);
      if (x === null || y === null) return (x === null ? 1 : 0) - (y === null ? 1 : 0);
      return y - x;  // worst (largest loss, smallest accuracy) first
    });
    shown.forEach(function (o) {
      var v = column < 0 ? null : (o.getAttribute("data-m") || "").split(" ")[column];
      o.textContent = o.value + (v ? "  (" + metric + " " + parseFloat(v).toFixed(4) + ")" : "");
    });
    var current = select.value;
    while (select.options.length) select.remove(0);
    shown.forEach(function (o) { select.add(o); });
    var tasks = view.allOptions.filter(function (o) { return !o.hasAttribute("data-pin"); }).length;
    var matching = shown.filter(function (o) { return !o.hasAttribute("data-pin"); }).length;
    picker.querySelector(".count").textContent = matching + " of " + tasks + " tasks";
    if (shown.some(function (o) { return o.value === current; })) select.value = current;
  }
  var views = document.querySelectorAll(".task-view");
  views.forEach(function (view) {
    var select = view.querySelector("select.task");
    view.querySelector("select.order").addEventListener("change", function () { arrange(view); });
    view.querySelector("input.filter").addEventListener("input", function () {
      arrange(view);
      if (select.options.length && select.value !== view.getAttribute("data-shown")) {
        show(view, select.value);
      }
    });
    arrange(view);
    select.addEventListener("change", function () {
      show(view, select.value);
      history.replaceState(null, "", "#task=" + encodeURIComponent(select.value));
    });
    view.querySelectorAll("button[data-step]").forEach(function (button) {
      button.addEventListener("click", function () {
        var step = parseInt(button.getAttribute("data-step"), 10);
        var n = select.options.length;
        if (n === 0) return;
        select.selectedIndex = (select.selectedIndex + step + n) % n;
        select.dispatchEvent(new Event("change"));
      });
    });
    if (select.options.length) show(view, select.options[0].value);
  });
  function fromHash(scroll) {
    var match = /(?:^#|&)task=([^&]*)/.exec(location.hash);
    if (!match) return;
    var task = decodeURIComponent(match[1]);
    var first = null;
    views.forEach(function (view) { if (show(view, task) && first === null) first = view; });
    if (scroll && first !== null) first.scrollIntoView();  // a clicked task link lands on its diagrams
  }
  window.addEventListener("hashchange", function () { fromHash(true); });
  fromHash(false);  // opened on a task: shown in place (the page's top stays in view)
  document.documentElement.setAttribute("data-report-ready", "1");
})();
"""

# One hatch pattern for every reliability diagram's gap (referenced from the style sheet by id).
SVG_DEFS = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
            '<pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            '<rect width="4" height="4" fill="#c44e52" fill-opacity="0.15"/>'
            '<line x1="0" y1="0" x2="0" y2="4" stroke="#c44e52" stroke-width="1.2"/></pattern></defs></svg>')
