// Theme and time zone, applied before the first paint; the menus in the header change them.
// Stored in this browser (localStorage): a person's choice, not a server setting.
"use strict";
(function () {
  var root = document.documentElement;
  function read(key, fallback) {
    try { return localStorage.getItem(key) || fallback; } catch (e) { return fallback; }
  }
  function write(key, value) {
    try { localStorage.setItem(key, value); } catch (e) { /* private mode: keep it for this page */ }
  }
  var theme = read("akri.theme", "system");
  if (theme !== "system") root.dataset.theme = theme;
  root.dataset.tz = read("akri.tz", "local");

  document.addEventListener("DOMContentLoaded", function () {
    var select = document.getElementById("theme-select");
    if (select) {
      select.value = theme;
      select.addEventListener("change", function () {
        theme = select.value;
        write("akri.theme", theme);
        if (theme === "system") delete root.dataset.theme; else root.dataset.theme = theme;
      });
    }
    var utc = document.getElementById("utc-toggle");
    if (utc) {
      utc.setAttribute("aria-pressed", String(root.dataset.tz === "utc"));
      utc.addEventListener("click", function () {
        root.dataset.tz = root.dataset.tz === "utc" ? "local" : "utc";
        write("akri.tz", root.dataset.tz);
        utc.setAttribute("aria-pressed", String(root.dataset.tz === "utc"));
        document.dispatchEvent(new CustomEvent("akri:times"));
      });
    }
  });
})();
