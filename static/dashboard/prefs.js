// Theme and time zone, applied before the first paint; the menus in the header change them.
// Stored in this browser (localStorage): a person's choice, not a server setting.
// Also the narrow header's menu button (below 1100 px the navigation and tools fold into it);
// without scripts the header shows everything, wrapped (the "js" class gates the folding).
"use strict";
(function () {
  var root = document.documentElement;
  root.classList.add("js");
  function read(key, fallback) {
    try { return localStorage.getItem(key) || fallback; } catch (e) { return fallback; }
  }
  function write(key, value) {
    try { localStorage.setItem(key, value); } catch (e) { /* private mode: keep it for this page */ }
  }
  var theme = read("akri.theme", "system");
  if (theme !== "system") root.dataset.theme = theme;
  root.dataset.tz = read("akri.tz", "local");

  function wireMenu() {
    var toggle = document.querySelector(".menu-toggle");
    var menu = document.getElementById("site-menu");
    if (!toggle || !menu) return;
    function setOpen(open, focusToggle) {
      toggle.setAttribute("aria-expanded", String(open));
      root.classList.toggle("menu-open", open);
      if (!open && focusToggle) toggle.focus();
    }
    toggle.addEventListener("click", function () {
      var open = toggle.getAttribute("aria-expanded") !== "true";
      setOpen(open, false);
      if (open) {
        var first = menu.querySelector("a, button, select");
        if (first) first.focus();
      }
    });
    document.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && toggle.getAttribute("aria-expanded") === "true") setOpen(false, true);
    });
    document.addEventListener("click", function (event) {
      if (toggle.getAttribute("aria-expanded") !== "true") return;
      if (!menu.contains(event.target) && !toggle.contains(event.target)) setOpen(false, false);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    wireMenu();
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
