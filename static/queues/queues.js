// Queues pages: the charge history chart (uPlot, vendored under static/queues/vendor) and live
// figures over /ws/queues/: a snapshot on connect, then one update per recompute that changed
// something. The header mark says in words whether the figures are live.
"use strict";
(function () {
  var mark = document.getElementById("live-mark");
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

  function setMark(state, text) {
    if (!mark) return;
    mark.dataset.state = state;
    mark.textContent = text;
  }

  function drawChart() {
    var holder = document.getElementById("queue-chart");
    var data = document.getElementById("queue-history");
    if (!holder || !data || !window.uPlot) return;
    var history = JSON.parse(data.textContent);
    var columns = [history.t];
    var series = [{}];
    history.series.forEach(function (s, i) {
      columns.push(s.values);
      series.push({ label: s.queue, stroke: COLORS[i % COLORS.length], width: 2 });
    });
    var width = Math.max(320, holder.clientWidth || 800);
    holder.chart = new window.uPlot(
      { width: width, height: 260, series: series, axes: [{}, { label: "devices" }], scales: { x: { time: true, range: [history.from, history.to] } } },
      columns,
      holder
    );
  }

  function text(el, value) {
    if (el && el.textContent !== String(value)) el.textContent = value;
  }

  function apply(msg) {
    ["charged", "uncharged_total", "orphans", "claims"].forEach(function (key) {
      if (key in msg) text(document.querySelector('[data-figure="' + key + '"]'), msg[key]);
    });
    var rows = {};
    document.querySelectorAll("[data-queue]").forEach(function (row) { rows[row.dataset.queue] = row; });
    var unknown = false;
    (msg.queues || []).forEach(function (q) {
      var row = rows[q.queue];
      if (!row) { unknown = true; return; }
      ["total", "owned", "uses_of_others", "used_by_others", "orphans"].forEach(function (key) {
        text(row.querySelector('[data-field="' + key + '"]'), key === "total" && row.tagName === "DL" ? q.total + " devices" : q[key]);
      });
      var by = row.querySelector('[data-field="charged"]');
      if (by) {
        var parts = Object.keys(q.charged).map(function (r) { return r + ": " + q.charged[r]; });
        text(by, parts.length ? parts.join(", ") : "nothing");
      }
    });
    var table = document.getElementById("queue-table");
    if (unknown && table) {
      var notice = document.getElementById("live-notice");
      if (notice) {
        notice.hidden = false;
        notice.textContent = "A new queue appeared: press Refresh to see it.";
      }
    }
  }

  function connect(attempt) {
    if (!("WebSocket" in window)) return;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + location.host + "/ws/queues/");
    setMark("connecting", "Connecting…");
    ws.onmessage = function (event) {
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "snapshot" || msg.type === "update") {
        attempt = 0;
        apply(msg);
        var at = new Date(msg.at);
        setMark("live", "Live: updated " + (window.akriTimes ? window.akriTimes.clock(at, true) : at.toISOString()));
        document.body.dataset.queuesLive = msg.type;
      }
    };
    ws.onclose = function (event) {
      if (event.code === 4401 || event.code === 4403 || event.code === 4400) {
        // Signed out, role removed or refused: a new socket would be refused the same way.
        setMark("stale", "Not live: " + (event.reason || "signed out") + " (reload the page)");
        return;
      }
      var wait = Math.min(30000, 500 * Math.pow(2, attempt));
      setMark(attempt > 3 ? "stale" : "reconnecting", attempt > 3 ? "Stale: reconnecting…" : "Reconnecting…");
      setTimeout(function () { connect(attempt + 1); }, wait);
    };
  }

  function start() {
    drawChart();
    connect(0);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
