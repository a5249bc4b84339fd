// Dashboard charts: slot usage and release latency from /api/charts/ (akri_site/dashboard/
// charts.py), drawn with the project's vendored uPlot. Series differ by dash pattern as well as
// colour, colours come from the theme's CSS variables (dark mode included), and every chart has
// a summary sentence and a table of its points. Charts ending "now" refetch while the page is
// open (every data-poll seconds, when the tab is visible), so they follow the sampler.
"use strict";
(function () {
  var SERIES = {
    usage: [
      { key: "held", label: "held", color: "--held", dash: null },
      { key: "free", label: "free", color: "--free", dash: [8, 5] },
      { key: "foreign", label: "foreign", color: "--foreign", dash: [2, 4] },
    ],
    latency: [
      { key: "mean_ms", label: "mean ms", color: "--accent", dash: null },
      { key: "max_ms", label: "worst ms", color: "--error", dash: [8, 5] },
    ],
  };

  // The theme's colours are light-dark() pairs, which a canvas cannot read: let the browser
  // resolve the variable on a probe element and take the computed rgb().
  var probe = null;
  function cssVar(name, fallback) {
    if (!probe) {
      probe = document.createElement("span");
      probe.hidden = true;
      document.body.appendChild(probe);
    }
    probe.style.color = "";
    probe.style.color = "var(" + name + ")";
    var value = getComputedStyle(probe).color;
    return value && probe.style.color ? value : fallback;
  }

  function tick(seconds, long) {
    var d = new Date(seconds * 1000);
    var time = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    return long ? pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " + time : time;
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function utc(seconds) {
    var d = new Date(seconds * 1000);
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  function span(seconds) {
    if (seconds % 3600 === 0) return seconds / 3600 + " h";
    return seconds / 60 + " min";
  }

  function numbers(values) { return values.filter(function (v) { return v !== null; }); }
  function latestIndex(values) {
    for (var i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return i;
    return -1;
  }

  function summaryOf(kind, data) {
    if (kind === "usage") {
      var held = numbers(data.held);
      if (!held.length) return "No samples in this range yet: the controller records one every minute.";
      var peak = Math.max.apply(null, held);
      var text = "";
      if (data.latest) {
        text = "Latest sample " + utc(data.latest.at) + ": " + data.latest.held + " held, " +
          data.latest.free + " free, " + data.latest.foreign + " foreign. ";
      }
      return text + "In this range: at most " + peak + " held (mean per " + span(data.step_seconds) + "), " +
        held.length + " of " + data.t.length + " intervals sampled.";
    }
    var releases = numbers(data.releases);
    if (!releases.length) return "No releases recorded in this range.";
    var total = releases.reduce(function (a, b) { return a + b; }, 0);
    var sum = 0;
    data.mean_ms.forEach(function (m, i) { if (m !== null) sum += m * data.releases[i]; });
    var worst = Math.max.apply(null, numbers(data.max_ms));
    return total + (total === 1 ? " release" : " releases") + " in this range: mean " +
      Math.round(sum / total) + " ms, worst " + Math.round(worst) + " ms.";
  }

  function fillTable(table, kind, data) {
    var caption = table.querySelector("caption");
    table.textContent = "";
    if (caption) table.appendChild(caption);
    var defs = SERIES[kind];
    var head = table.createTHead().insertRow();
    ["Interval from"].concat(defs.map(function (d) { return d.label; }))
      .concat(kind === "latency" ? ["releases"] : []).forEach(function (name) {
        var th = document.createElement("th");
        th.scope = "col";
        th.textContent = name;
        head.appendChild(th);
      });
    var body = table.createTBody();
    for (var i = data.t.length - 1; i >= 0; i--) {
      var values = defs.map(function (d) { return data[d.key][i]; });
      if (values.every(function (v) { return v === null; })) continue;
      var row = body.insertRow();
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = utc(data.t[i]);
      row.appendChild(th);
      values.concat(kind === "latency" ? [data.releases[i]] : []).forEach(function (v) {
        var td = row.insertCell();
        td.className = "num";
        td.textContent = v === null ? "no data" : v;
      });
    }
  }

  function options(kind, holder, data) {
    var axis = { stroke: cssVar("--muted", "#666"), grid: { stroke: cssVar("--border", "#ddd"), width: 1 },
      ticks: { stroke: cssVar("--border", "#ddd"), width: 1 } };
    // Without the cursor on the chart the legend shows each series' latest value (it said
    // "no data" under lines that had data); on a gap under the cursor, "no sample".
    var series = [{ label: "time (UTC)", value: function (u, v, s, idx) {
      if (idx == null) { var i = latestIndex(u.data[1] || []); return i < 0 ? "—" : utc(u.data[0][i]) + " (latest)"; }
      return v == null ? "—" : utc(v);
    } }];
    SERIES[kind].forEach(function (d) {
      // Few values (a fresh history, or gaps): mark each one, or a lone sample draws nothing.
      var few = numbers(data[d.key]).length < 60;
      var s = { label: d.label, stroke: cssVar(d.color, "#333"), width: 2, spanGaps: false,
        points: { show: few, size: 6, fill: cssVar("--panel", "#fff") },
        value: function (u, v, sidx, idx) {
          if (idx == null) { var i = latestIndex(u.data[sidx]); return i < 0 ? "no data" : u.data[sidx][i] + " (latest)"; }
          return v == null ? "no sample" : String(v);
        } };
      if (d.dash) s.dash = d.dash;
      series.push(s);
    });
    return {
      width: Math.max(280, holder.clientWidth || 600),
      height: 220,
      series: series,
      tzDate: function (ts) { return window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
      scales: { x: { time: true, range: [data.from, data.to] }, y: { range: function (u, min, max) { return [0, Math.max(1, max || 0) * 1.1]; } } },
      axes: [
        // 24-hour UTC times, with the date when the range spans more than a day.
        Object.assign({ values: function (u, splits) {
          var long = data.to - data.from > 86400;
          return splits.map(function (v) { return tick(v, long); });
        } }, axis),
        Object.assign({ label: kind === "usage" ? "slots" : "ms" }, axis),
      ],
      legend: { live: true },
    };
  }

  function columns(kind, data) {
    return [data.t].concat(SERIES[kind].map(function (d) { return data[d.key]; }));
  }

  function Chart(figure) {
    this.figure = figure;
    this.kind = figure.dataset.chart;
    this.url = figure.dataset.url;
    this.holder = figure.querySelector("[data-chart-plot]");
    this.plot = null;
    this.data = null;
    this.updates = 0;
  }

  Chart.prototype.draw = function () {
    if (!window.uPlot || !this.data) return;
    if (this.plot) this.plot.destroy();
    this.holder.textContent = "";
    this.plot = new window.uPlot(options(this.kind, this.holder, this.data), columns(this.kind, this.data), this.holder);
  };

  Chart.prototype.show = function (data) {
    var first = this.data === null;
    this.data = data;
    this.updates += 1;
    if (first || !this.plot) this.draw();
    else {
      this.plot.setScale("x", { min: data.from, max: data.to });
      this.plot.setData(columns(this.kind, data), false);
      this.plot.setScale("x", { min: data.from, max: data.to });
    }
    var step = this.figure.querySelectorAll("[data-chart-step]");
    step.forEach(function (el) { el.textContent = span(data.step_seconds); });
    this.figure.querySelector("[data-chart-summary]").textContent = summaryOf(this.kind, data);
    fillTable(this.figure.querySelector("[data-chart-table]"), this.kind, data);
    this.figure.dataset.state = "drawn";
    this.figure.dataset.points = numbers(data[SERIES[this.kind][0].key]).length;
    this.figure.dataset.updates = this.updates;
    this.figure.dataset.latest = data.latest ? JSON.stringify(data.latest) : "";
  };

  Chart.prototype.fetch = function () {
    var self = this;
    return window.fetch(this.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (data) { self.show(data); })
      .catch(function (err) {
        self.figure.dataset.state = "error";
        self.figure.querySelector("[data-chart-summary]").textContent =
          "Could not load the chart data (" + err.message + "); it will be tried again.";
      });
  };

  function start() {
    var charts = Array.prototype.map.call(document.querySelectorAll("figure[data-chart]"), function (f) {
      return new Chart(f);
    });
    if (!charts.length) return;
    charts.forEach(function (c) {
      c.fetch();
      var poll = Number(c.figure.dataset.poll) || 0;  // 0: a range that has ended
      if (poll > 0) setInterval(function () { if (!document.hidden) c.fetch(); }, Math.max(2, poll) * 1000);
    });
    var redraw = function () { charts.forEach(function (c) { c.draw(); }); };
    var timer = null;
    window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(redraw, 200); });
    // The theme follows the system or the page's own choice: colours are read again on change.
    if (window.matchMedia) window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", redraw);
    new MutationObserver(redraw).observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme", "class", "style"] });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
