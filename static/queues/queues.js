// Queues pages: the charge history chart (uPlot, vendored under static/queues/vendor) and live
// figures over /ws/queues/: a snapshot on connect, then one update per recompute that changed
// something. What the socket hears goes to the header's mark (static/dashboard/mark.js), the
// one place that says whether the figures are live; a ping every 20 s keeps "updated" true
// while nothing changes.
"use strict";
(function () {
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
  var PING_MS = 20000;
  var feed = null;

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  // Times as everywhere else on the site: 24-hour UTC (uPlot's own default is the browser's
  // zone on a 12-hour clock), with the date once the range spans more than a day.
  function tick(seconds, long) {
    var d = new Date(seconds * 1000);
    var time = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    return long ? pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + time : time;
  }
  function utc(seconds) {
    var d = new Date(seconds * 1000);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + " UTC";
  }
  // The legend without the cursor on the chart: each series' latest value, not "no data".
  function latest(column) {
    for (var i = column.length - 1; i >= 0; i--) if (column[i] !== null && column[i] !== undefined) return i;
    return -1;
  }

  function drawChart() {
    var holder = document.getElementById("queue-chart");
    var data = document.getElementById("queue-history");
    if (!holder || !data || !window.uPlot) return;
    var history = JSON.parse(data.textContent);
    var columns = [history.t];
    var series = [{
      label: "time (UTC)",
      value: function (u, v, s, idx) {
        if (idx == null) { var i = latest(u.data[1] || []); return i < 0 ? "—" : utc(u.data[0][i]) + " (latest)"; }
        return v == null ? "—" : utc(v);
      },
    }];
    history.series.forEach(function (s, i) {
      columns.push(s.values);
      series.push({
        label: s.queue, stroke: COLORS[i % COLORS.length], width: 2,
        value: function (u, v, sidx, idx) {
          if (idx == null) { var at = latest(u.data[sidx]); return at < 0 ? "no data" : u.data[sidx][at] + " (latest)"; }
          return v == null ? "no sample" : String(v);
        },
      });
    });
    var width = Math.max(320, holder.clientWidth || 800);
    var long = history.to - history.from > 86400;
    holder.chart = new window.uPlot(
      {
        width: width, height: 260, series: series,
        tzDate: function (ts) { return window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
        axes: [
          { values: function (u, splits) { return splits.map(function (v) { return tick(v, long); }); } },
          // Devices are whole: ticks at whole numbers only (uPlot would put some at 1.2, 1.4).
          { label: "devices", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
            values: function (u, splits) { return splits.map(function (v) { return String(Math.round(v)); }); } },
        ],
        scales: {
          x: { time: true, range: [history.from, history.to] },
          y: { range: function (u, min, max) { return [0, Math.max(1, Math.ceil((max || 0) * 1.1))]; } },
        },
      },
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
    var ping = null;
    ws.onopen = function () {
      feed.opened();
      ping = setInterval(function () {
        if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "ping" }));
      }, PING_MS);
    };
    ws.onmessage = function (event) {
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      feed.heard();
      if (msg.type === "snapshot" || msg.type === "update") {
        attempt = 0;
        apply(msg);
        document.body.dataset.queuesLive = msg.type;
      }
    };
    ws.onclose = function (event) {
      clearInterval(ping);
      if (event.code === 4401 || event.code === 4403 || event.code === 4400) {
        // Signed out, role removed or refused: a new socket would be refused the same way.
        feed.stop((event.reason || "signed out") + " (reload the page)");
        return;
      }
      feed.lost();
      var wait = Math.min(30000, 500 * Math.pow(2, attempt));
      setTimeout(function () { connect(attempt + 1); }, wait);
    };
  }

  function start() {
    drawChart();
    if (!window.akriMark) return;
    feed = window.akriMark.feed();
    connect(0);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
