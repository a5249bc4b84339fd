// One date format everywhere, in the browser: the JS side of the `when` template filter.
//
// The server renders <time datetime="2026-11-24T09:31:05Z">2026-11-24 09:31:05 UTC</time>;
// this rewrites the text to the same shape in the viewer's zone (or UTC, by the header's UTC
// toggle, stored in <html data-tz>), always naming the zone, and keeps the age current:
//   plain           "2026-11-24 10:31:05 CET"              (age in the title)
//   data-ago        "2026-11-24 10:31:05 CET (3 min ago)"
//   data-relative   "3 min ago"                             (absolute time in the title)
//   data-clock      "10:31:05 CET"                          (time of day; the live mark's)
// Live code calls akriTimes.render(element) on what it inserts; live.js re-renders every 5 s.
"use strict";
(function () {
  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function utc() { return document.documentElement.dataset.tz === "utc"; }
  function zone(d) {
    if (utc()) return "UTC";
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(d);
      for (var i = 0; i < parts.length; i++) if (parts[i].type === "timeZoneName") return parts[i].value;
    } catch (e) { /* old browser: fall back to the offset */ }
    var off = -d.getTimezoneOffset();
    return "UTC" + (off < 0 ? "-" : "+") + pad(Math.floor(Math.abs(off) / 60)) + ":" + pad(Math.abs(off) % 60);
  }
  function fields(d, inUtc) {
    return inUtc
      ? [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()]
      : [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()];
  }
  // "2026-11-24 09:31:05 UTC": the one absolute format.
  function format(d, inUtc) {
    var u = inUtc === undefined ? utc() : inUtc;
    var f = fields(d, u);
    return f[0] + "-" + pad(f[1]) + "-" + pad(f[2]) + " " + pad(f[3]) + ":" + pad(f[4]) + ":" + pad(f[5]) +
      " " + (u ? "UTC" : zone(d));
  }
  // "09:31 UTC": time of day, for the live marks ("Stale since ...") where the day is today.
  function clock(d, seconds) {
    var f = fields(d, utc());
    return pad(f[3]) + ":" + pad(f[4]) + (seconds ? ":" + pad(f[5]) : "") + " " + zone(d);
  }
  function ago(d) {
    var s = Math.max(0, Math.round((Date.now() - d.getTime()) / 1000));
    if (s < 120) return s + " s ago";
    if (s < 7200) return Math.floor(s / 60) + " min ago";
    if (s < 172800) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }
  function render(root) {
    var nodes = (root || document).querySelectorAll("time[datetime]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) continue;
      var text, title;
      if (el.hasAttribute("data-relative")) {
        text = ago(d);
        title = format(d);
      } else if (el.hasAttribute("data-clock")) {
        text = clock(d, true);
        title = format(d) + " (" + ago(d) + ")";
      } else {
        text = el.hasAttribute("data-ago") ? format(d) + " (" + ago(d) + ")" : format(d);
        title = utc() ? ago(d) : format(d, true) + " (" + ago(d) + ")";
      }
      if (el.textContent !== text) el.textContent = text;
      if (el.title !== title) el.title = title;
    }
  }
  window.akriTimes = { format: format, clock: clock, ago: ago, render: render };
})();
