// Live dashboard: a snapshot on connect, then deltas over the websocket (ws/live/).
//
// The server renders every row; deltas carry the same rows as HTML fragments from the same
// renderers (`html`: one <tr> by Instance key; `runs_html` by run id), swapped in place by
// data attribute.
// The header's mark (static/dashboard/mark.js) says in words whether what you see is live:
// this script reports to it what the socket hears, and the cache's own freshness (`sync`).
// Pages without a live view never start a feed, and their mark stays "Not live".
// Hidden tabs buffer deltas and retry slowly; the Refresh button reloads the page anyway.
"use strict";
(function () {
  var body = document.body;
  var view = body.dataset.liveView;
  var notice = document.getElementById("live-notice");

  var PING_MS = 20000;            // heartbeat when visible
  var PING_HIDDEN_MS = 60000;     // and when the tab is hidden
  var MAX_BACKOFF_MS = 30000;
  var HIDDEN_RETRY_MS = 60000;
  var MAX_PENDING = 100;          // buffered deltas while hidden; beyond that, ask for a snapshot

  var ws = null;
  var attempt = 0;
  var retryTimer = null;
  var pingTimer = null;
  var lastMessageAt = null;
  var sync = null;
  var connectedOnce = false;
  var stopped = false;
  var pending = [];
  var overflowed = false;
  var feed = null;           // akriMark's feed, on pages with a live view

  // ---- times (static/dashboard/times.js) -------------------------------------------------------
  var renderTimes = window.akriTimes.render;

  // ---- release actions ----------------------------------------------------------------------
  // While the page is stale what it shows may be wrong, so its Release links are disabled and
  // a notice says why; the server re-checks every release anyway (the value the operator saw).
  function isStale() {
    // A page whose feed stopped for good (signed out) says "Not live": its data is as old.
    var state = window.akriMark.state();
    return state === "stale" || (feed !== null && state === "static");
  }
  function releaseActions(root) {
    var stale = isStale();
    var links = root.querySelectorAll("a[data-release]");
    for (var i = 0; i < links.length; i++) {
      var a = links[i];
      if (stale && a.hasAttribute("href")) {
        a.dataset.href = a.getAttribute("href");
        a.removeAttribute("href");
        a.setAttribute("aria-disabled", "true");
        a.title = "Disabled while this page is stale";
      } else if (!stale && a.dataset.href) {
        a.setAttribute("href", a.dataset.href);
        delete a.dataset.href;
        a.removeAttribute("aria-disabled");
        a.removeAttribute("title");
      }
    }
    var why = document.getElementById("release-stale");
    if (why) why.hidden = !stale;
  }
  // Rows from the live feed are rendered without this page's view: give their Release links
  // the way back to it (filters, sort, page), as the server does for the rows it draws.
  function releaseBack(row) {
    var back = location.search.slice(1);
    row.querySelectorAll("a[data-release]").forEach(function (a) {
      var href = a.getAttribute("href");
      if (href && back && href.indexOf("?") < 0) a.setAttribute("href", href + "?back=" + encodeURIComponent(back));
    });
    releaseActions(row);
  }
  // What the cache says of itself (``queries.sync_status``), for the mark.
  function reportSync() {
    if (!feed || !sync) return;
    var problem = null, partial = null;
    if (sync.stale && sync.stale.length) {
      problem = sync.stale_since ? { since: new Date(sync.stale_since), why: "cache not syncing" }
                                 : { since: null, why: "cache never synced" };
    } else if (sync.watchers === 0) {
      problem = { since: null, why: "cache never synced" };
    } else if (sync.syncing && sync.syncing.length) {
      // A relist is being written page by page: live, but the counts are not whole yet.
      var kinds = sync.syncing.map(function (w) { return w.kind.split("/").pop(); });
      partial = "syncing " + kinds.join(", ");
    }
    feed.cache(problem, partial);
  }

  function showNotice(text, withRefresh) {
    if (!notice) return;
    notice.textContent = text + " ";
    if (withRefresh) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "button";
      b.textContent = "Refresh";
      b.addEventListener("click", function () { location.reload(); });
      notice.appendChild(b);
    }
    notice.hidden = false;
  }

  // ---- applying snapshots and deltas ----------------------------------------------------------
  function fragment(html) {
    var t = document.createElement("template");
    t.innerHTML = html.trim();
    return t.content.firstElementChild;
  }
  function byAttr(root, name, value) {
    return root.querySelector("[" + name + '="' + CSS.escape(value) + '"]');
  }
  function flash(el) {
    el.classList.remove("changed");
    void el.offsetWidth;  // restart the animation
    el.classList.add("changed");
  }

  function applyInstances(msg, snapshot) {
    var maps = document.querySelectorAll("[data-slot-map]");
    if (!maps.length) return;
    var html = msg.html || {};
    var missingConfigs = {};
    maps.forEach(function (map) {
      (msg.removed || []).forEach(function (key) {
        var old = byAttr(map, "data-instance", key);
        if (old) old.remove();
      });
      var seen = {};
      (msg.instances || []).forEach(function (inst) {
        seen[inst.key] = true;
        if (!html[inst.key]) return;
        var row = fragment(html[inst.key]);
        var old = byAttr(map, "data-instance", inst.key);
        if (old) {
          if (old.dataset.v && old.dataset.v === row.dataset.v) return;  // unchanged
          old.replaceWith(row);
        } else {
          // New in this view: insert in name order, in its Configuration's table.
          var section = byAttr(map, "data-configuration", inst.configuration);
          var tbody = section && section.querySelector("table tbody");
          if (!tbody) { missingConfigs[inst.configuration] = true; return; }
          var before = null;
          var rows = tbody.querySelectorAll("tr[data-instance]");
          for (var i = 0; i < rows.length; i++) {
            if (rows[i].dataset.instance > inst.key) { before = rows[i]; break; }
          }
          tbody.insertBefore(row, before);
        }
        releaseBack(row);
        renderTimes(row);
        flash(row);
      });
      // A complete snapshot is the whole truth for this view: drop what it no longer has.
      if (snapshot && !msg.truncated) {
        map.querySelectorAll("tr[data-instance]").forEach(function (el) {
          if (!seen[el.dataset.instance]) el.remove();
        });
      }
    });
    var shown = document.querySelector("[data-shown-slots]");
    if (shown) {
      var count = document.querySelectorAll("[data-slot-map] td[data-slot]:not(.dim)").length;
      shown.textContent = count === 1 ? "1 slot" : count + " slots";
    }
    var names = Object.keys(missingConfigs);
    if (names.length) showNotice("New Instances of " + names.join(", ") + " are not on this page yet.", true);
  }

  function applyCounts(summary) {
    if (!summary) return;
    document.querySelectorAll("[data-count-config]").forEach(function (el) {
      var c = summary.configurations[el.dataset.countConfig];
      var text = String(c ? c[el.dataset.count] || 0 : 0);
      if (el.textContent !== text) el.textContent = text;
    });
    document.querySelectorAll("[data-count-node]").forEach(function (el) {
      var n = summary.nodes[el.dataset.countNode];
      var text = String(n ? n[el.dataset.count] || 0 : 0);
      if (el.textContent !== text) el.textContent = text;
    });
    document.querySelectorAll("[data-count-total]").forEach(function (el) {
      var text = String(summary.totals[el.dataset.countTotal] || 0);
      if (el.textContent !== text) el.textContent = text;
    });
  }

  function runMatches(table, run) {
    // The history's default view leaves out runs that changed nothing (?show=all lists them).
    if (table.hasAttribute("data-hide-nothing") && run.result === "nothing") return false;
    var keys = ["scope", "node", "trigger", "result"];
    for (var i = 0; i < keys.length; i++) {
      var want = table.getAttribute("data-filter-" + keys[i]);
      if (want && String(run[keys[i]]) !== want) return false;
    }
    return true;
  }

  function applyRuns(msg) {
    var runs = msg.runs || [];
    if (!runs.length) return;
    var html = msg.runs_html || {};
    var table = document.querySelector("table[data-runs-table]");
    if (table) {
      var tbody = table.tBodies[0];
      runs.forEach(function (run) {
        var frag = html[String(run.id)];
        if (!frag) return;
        var row = fragment(frag);
        var old = byAttr(tbody, "data-run", String(run.id));
        if (old) {
          // A run row changes only if the run was still being recorded: replace it quietly.
          old.replaceWith(row);
          renderTimes(row);
          return;
        }
        if (!table.hasAttribute("data-appendable") || !runMatches(table, run)) return;
        tbody.insertBefore(row, tbody.firstElementChild);
        var empty = document.querySelector("[data-runs-empty]");
        if (empty) empty.remove();
        renderTimes(row);
        flash(row);
      });
    }
    var last = document.querySelector("[data-last-run]");
    if (last) {
      var newest = runs[runs.length - 1];
      var shown = last.querySelector("time");
      if (!shown || new Date(shown.getAttribute("datetime")) <= new Date(newest.started_at)) {
        var a = document.createElement("a");
        a.href = newest.url;
        var t = document.createElement("time");
        t.setAttribute("datetime", newest.started_at);
        t.setAttribute("data-relative", "");
        a.appendChild(t);
        last.replaceChildren(a);
        renderTimes(last);
        var detail = document.querySelector("[data-last-run-detail]");
        if (detail) {
          detail.textContent = newest.scope + (newest.node ? " " + newest.node : "") + ", " + newest.trigger +
            ": released " + newest.released + ", restored " + newest.restored +
            ", conflicts " + newest.conflicts + ", errors " + newest.errors;
        }
      }
    }
  }

  // Parts of a page marked data-live-refresh="audit" or "run-<id>" are fetched again (the same
  // URL, rendered by the same templates) when a delta says an audit entry was written or that
  // run changed, and after a reconnect; one fetch at a time, one more if asked meanwhile.
  var refetching = false;
  var refetchAgain = false;

  function refetchParts() {
    if (refetching) { refetchAgain = true; return; }
    refetching = true;
    window.fetch(location.href, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-refresh]").forEach(function (el) {
          var fresh = byAttr(doc, "data-live-refresh", el.dataset.liveRefresh);
          if (!fresh || fresh.innerHTML === el.innerHTML) return;
          var node = document.importNode(fresh, true);
          el.replaceWith(node);
          renderTimes(node);
          flash(node);
        });
      })
      .catch(function () { showNotice("Could not refresh this page's list: press Refresh.", true); })
      .then(function () {
        refetching = false;
        if (refetchAgain) { refetchAgain = false; refetchParts(); }
      });
  }

  function applyRefresh(msg, snapshot) {
    var parts = document.querySelectorAll("[data-live-refresh]");
    if (!parts.length) return;
    var wanted = {};
    if (msg.audit) wanted.audit = true;
    (msg.runs || []).forEach(function (run) { wanted["run-" + run.id] = true; });
    var hit = (snapshot && connectedOnce) || Array.prototype.some.call(parts, function (el) {
      return wanted[el.dataset.liveRefresh];
    });
    if (hit) refetchParts();
  }

  function apply(msg, snapshot) {
    if (msg.sync) sync = msg.sync;
    applyCounts(msg.summary);
    if (view === "slots") applyInstances(msg, snapshot);
    applyRefresh(msg, snapshot);
    applyRuns(msg);
    if (snapshot && msg.truncated && connectedOnce) {
      showNotice("Reconnected. Changes made while offline may be missing from this long page.", true);
    }
    reportSync();
  }

  function handle(msg) {
    switch (msg.type) {
      case "snapshot":
        pending = [];
        overflowed = false;
        apply(msg, true);
        connectedOnce = true;
        break;
      case "delta":
        if (document.hidden) {
          if (pending.length < MAX_PENDING) pending.push(msg); else overflowed = true;
        } else {
          apply(msg, false);
        }
        break;
      case "pong":
        sync = msg.sync;
        reportSync();
        break;
      case "error":
        showNotice("Live updates stopped: " + msg.error, true);
        break;
    }
  }

  function flushPending() {
    if (overflowed && ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: "refresh" }));
    } else {
      pending.forEach(function (msg) { apply(msg, false); });
    }
    pending = [];
    overflowed = false;
  }

  // ---- connection -----------------------------------------------------------------------------
  function heartbeat() {
    clearTimeout(pingTimer);
    var every = document.hidden ? PING_HIDDEN_MS : PING_MS;
    pingTimer = setTimeout(function () {
      if (!ws || ws.readyState !== WebSocket.OPEN) return;
      // Nothing heard for two beats: the connection is dead even if the socket says open.
      if (lastMessageAt !== null && Date.now() - lastMessageAt > 2 * every + 5000) {
        ws.close();
        return;
      }
      ws.send(JSON.stringify({ type: "ping" }));
      heartbeat();
    }, every);
  }

  function scheduleReconnect() {
    clearTimeout(retryTimer);
    var base = Math.min(MAX_BACKOFF_MS, 1000 * Math.pow(2, attempt));
    attempt += 1;
    var delay = base / 2 + Math.random() * (base / 2);
    if (document.hidden) delay = Math.max(delay, HIDDEN_RETRY_MS);
    retryTimer = setTimeout(connect, delay);
  }

  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    var scheme = location.protocol === "https:" ? "wss:" : "ws:";
    var query = body.dataset.liveQuery;
    var socket = new WebSocket(scheme + "//" + location.host + body.dataset.wsPath + (query ? "?" + query : ""));
    ws = socket;
    socket.addEventListener("open", function () {
      attempt = 0;
      lastMessageAt = Date.now();
      heartbeat();
      feed.opened();
    });
    socket.addEventListener("message", function (event) {
      lastMessageAt = Date.now();
      feed.heard();
      var msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      handle(msg);
    });
    socket.addEventListener("close", function (event) {
      if (ws !== socket) return;
      ws = null;
      clearTimeout(pingTimer);
      if (event.code === 4401 || event.code === 4403) {
        // Signed out or role removed: a new socket would be refused; the page must reload.
        stopped = true;
        feed.stop((event.reason || "signed out") + " (reload the page)");
        return;
      }
      if (event.code === 4400) {
        // The server refused what this page sent; retrying would be refused the same way.
        stopped = true;
        feed.stop(event.reason || "refused by the server");
        return;
      }
      feed.lost();
      scheduleReconnect();
    });
  }

  // ---- wiring ---------------------------------------------------------------------------------
  function measureHeader() {
    // Table headers stick just below the page header, whose height depends on wrapping.
    var header = document.querySelector("header.top");
    if (header) document.documentElement.style.setProperty("--header-h", header.offsetHeight + "px");
  }

  document.addEventListener("DOMContentLoaded", function () {
    measureHeader();
    window.addEventListener("resize", measureHeader);
    var refresh = document.getElementById("refresh");
    if (refresh) refresh.addEventListener("click", function () { location.reload(); });
    renderTimes(document);
    document.addEventListener("akri:times", function () { renderTimes(document); });
    // Ages ("3 min ago") move on; the mark is mark.js's business, and stays untouched here.
    setInterval(function () {
      if (!document.hidden) renderTimes(document);
    }, 5000);
    if (!view || !("WebSocket" in window)) return;
    feed = window.akriMark.feed();
    window.akriMark.onChange(function () { releaseActions(document); });
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) return;
      flushPending();
      heartbeat();
      if (!ws && !stopped) connect();  // retrying slowly while hidden: try now
    });
    connect();
  });
})();
