// aioqueue dashboard: live updates and small conveniences, no dependencies.
//
// A page names its live endpoint in <body data-live-url>. Every update is one JSON object:
//   values: {key: text}        -> textContent of every [data-live=key] (and value of [data-live-value=key])
//   html:   {key: svg}         -> innerHTML of [data-live-html=key] (server-drawn charts, numbers only)
//   tables: {key: [[cell]]}    -> rows of <tbody data-live-table=key>, built with textContent
//   state:  "failed" | ...     -> shows the [data-states~=state] buttons, hides the others
// The source is polling (pollSource); an EventSource giving the same objects can replace it.
"use strict";

(function () {
  function apply(update) {
    var values = update.values || {};
    Object.keys(values).forEach(function (key) {
      var text = values[key] === null ? "" : String(values[key]);
      document.querySelectorAll('[data-live="' + CSS.escape(key) + '"]').forEach(function (el) {
        if (el.textContent !== text) { el.textContent = text; flash(el); }
      });
      document.querySelectorAll('[data-live-value="' + CSS.escape(key) + '"]').forEach(function (el) {
        el.value = text;
      });
    });
    var html = update.html || {};
    Object.keys(html).forEach(function (key) {
      document.querySelectorAll('[data-live-html="' + CSS.escape(key) + '"]').forEach(function (el) {
        el.innerHTML = html[key];
      });
    });
    var tables = update.tables || {};
    Object.keys(tables).forEach(function (key) {
      document.querySelectorAll('[data-live-table="' + CSS.escape(key) + '"]').forEach(function (body) {
        fillTable(body, tables[key]);
      });
    });
    if (update.state) { showState(update.state); }
    hideEmpty();
  }

  // a box marked data-hide-empty (the traceback) shows only while its live text has any
  function hideEmpty() {
    document.querySelectorAll("[data-hide-empty]").forEach(function (box) {
      var live = box.querySelector("[data-live]");
      box.hidden = !live || !live.textContent.trim();
    });
  }

  function fillTable(body, rows) {
    var cols = body.closest("table").querySelectorAll("thead th").length;
    var fresh = document.createDocumentFragment();
    rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (cell) {
        var td = document.createElement("td");
        td.textContent = String(cell);
        tr.appendChild(td);
      });
      fresh.appendChild(tr);
    });
    if (!rows.length) {
      var tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = cols; td.className = "empty"; td.textContent = "None.";
      tr.appendChild(td); fresh.appendChild(tr);
    }
    body.replaceChildren(fresh);
  }

  function showState(state) {
    document.body.dataset.state = state;
    document.querySelectorAll("[data-states]").forEach(function (el) {
      el.hidden = el.dataset.states.split(" ").indexOf(state) < 0;
    });
    document.querySelectorAll("[data-state-badge]").forEach(function (el) {
      el.className = el.className.replace(/\bs-\w+/g, "").trim() + " s-" + state;
    });
  }

  function flash(el) {
    el.classList.remove("changed");
    void el.offsetWidth;
    el.classList.add("changed");
  }

  // the live source: GET the endpoint every interval; onUpdate gets each object
  function pollSource(url, intervalMs, onUpdate, onHealth) {
    var stopped = false;
    function tick() {
      if (stopped) { return; }
      fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
        .then(function (data) { onHealth(true); onUpdate(data); })
        .catch(function () { onHealth(false); })
        .then(function () { setTimeout(tick, document.hidden ? intervalMs * 5 : intervalMs); });
    }
    setTimeout(tick, intervalMs);
    return { close: function () { stopped = true; } };
  }

  function health(ok) {
    var dot = document.getElementById("live-dot");
    if (dot) { dot.className = "live-dot " + (ok ? "up" : "down"); }
  }

  function conveniences() {
    document.querySelectorAll("[data-select-all]").forEach(function (box) {
      box.addEventListener("change", function () {
        box.closest("form").querySelectorAll('input[name="ids"]').forEach(function (c) { c.checked = box.checked; });
      });
    });
    document.querySelectorAll("[data-confirm]").forEach(function (btn) {
      btn.addEventListener("click", function (ev) {
        if (!window.confirm(btn.dataset.confirm)) { ev.preventDefault(); }
      });
    });
    document.querySelectorAll("[data-needs-selection]").forEach(function (btn) {
      btn.addEventListener("click", function (ev) {
        if (!btn.closest("form").querySelector('input[name="ids"]:checked')) {
          ev.preventDefault();
          window.alert("Select one or more jobs first.");
        }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    conveniences();
    var body = document.body;
    if (body.dataset.state) { showState(body.dataset.state); }
    if (body.dataset.liveUrl) {
      var ms = parseInt(body.dataset.pollMs || "2000", 10);
      window.aioqueueLive = pollSource(body.dataset.liveUrl, ms, apply, health);
      health(true);
    }
  });
})();
