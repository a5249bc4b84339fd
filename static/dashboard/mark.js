// The header's live mark: on every page, whether what it shows is live, in words.
//
// Exactly one of four states (#live-mark's data-state). The words and their reason are in
// #live-mark, an aria-live region written only when they change; the part that ticks (a
// time, a duration) is in #live-age beside it, which is not announced.
//   live          "Live"                       "updated 09:31:05 UTC"
//   reconnecting  "Reconnecting…"              "for 8 s · data from 09:31:05 UTC"
//                 ("Connecting…" until the page's first connection)
//   stale         "Stale since 09:31 UTC"      "2 min old · reconnecting"  (or why: the cache
//                 stopped syncing, the server fell silent)
//   static        "Not live"                   "loaded 09:31:05 UTC"  (a page without a feed:
//                 the server wrote it, nothing here ever touches it); also a feed that
//                 stopped for good ("Not live: signed out (reload the page)").
//
// A page's feed (live.js on ws/live/, queues.js on ws/queues/) reports what it hears through
// akriMark.feed(); the mark is computed from those reports alone, so two scripts can never
// write contradicting words.
"use strict";
(function () {
  var RECONNECTING_FOR_MS = 15000;  // disconnected longer than this: stale, not reconnecting
  var SILENT_AFTER_MS = 45000;      // an open socket that said nothing for this long (two
                                    // missed pongs, live.js pings every 20 s): stale

  var mark = null;
  var age = null;
  var current = null;        // the one feed of this page, once a script asked for it
  var listeners = [];
  var ticker = null;

  function clock(d, seconds) { return window.akriTimes ? window.akriTimes.clock(d, seconds) : d.toISOString(); }
  function duration(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    if (s < 120) return s + " s";
    if (s < 7200) return Math.floor(s / 60) + " min";
    return Math.floor(s / 3600) + " h";
  }

  function elements() {
    if (!mark) {
      mark = document.getElementById("live-mark");
      age = document.getElementById("live-age");
    }
    return !!mark;
  }

  function write(state, words, detail) {
    if (!elements()) return;
    var changed = mark.dataset.state !== state;
    if (changed) mark.dataset.state = state;
    if (mark.textContent !== words) mark.textContent = words;
    if (age && age.textContent !== detail) age.textContent = detail;
    if (age) age.dataset.state = state;
    if (changed) listeners.forEach(function (fn) { fn(state); });
  }

  function Feed() {
    this.loadedAt = Date.now();  // what the server rendered is as old as the page
    this.openAt = null;          // the socket is open since (null: not open)
    this.everLive = false;
    this.heardAt = null;         // last frame from the server (data or pong)
    this.lostAt = null;          // the feed was lost at (null: live, or never was)
    this.problem = null;         // the server says its data is stale: {since: Date|null, why}
    this.partial = null;         // live, but counts partial (a relist being written)
    this.stopped = null;         // ended for good: the words why
  }
  Feed.prototype.opened = function () { this.openAt = Date.now(); render(); };
  // A frame from the server. Only a socket that has spoken is live: one that opens and
  // closes at once (a proxy, a refused handshake) goes on counting as lost.
  Feed.prototype.heard = function () {
    this.heardAt = Date.now();
    if (this.openAt !== null) { this.lostAt = null; this.everLive = true; }
    render();
  };
  Feed.prototype.lost = function () {
    if (this.lostAt === null) this.lostAt = Date.now();
    this.openAt = null;
    render();
  };
  // The server's own word on its data: a problem {since, why} or null; partial: words or null.
  Feed.prototype.cache = function (problem, partial) {
    this.problem = problem || null;
    this.partial = partial || null;
    render();
  };
  Feed.prototype.stop = function (why) { this.stopped = why; this.openAt = null; render(); };
  Feed.prototype.dataFrom = function () { return new Date(this.heardAt || this.loadedAt); };
  Feed.prototype.speaking = function () {
    return this.openAt !== null && this.heardAt !== null && this.heardAt >= this.openAt;
  };

  function render() {
    var f = current;
    if (!f) return;  // no feed: the server's static mark stays as it was written
    var now = Date.now();
    if (f.stopped) {
      write("static", "Not live: " + f.stopped, "data from " + clock(f.dataFrom(), true));
      return;
    }
    if (!f.speaking()) {
      var since = f.lostAt !== null ? f.lostAt : f.loadedAt;
      if (now - since <= RECONNECTING_FOR_MS) {
        write("reconnecting", f.everLive ? "Reconnecting…" : "Connecting…",
              "for " + duration(now - since) + " · data from " + clock(f.dataFrom(), true));
      } else {
        write("stale", "Stale since " + clock(f.dataFrom(), false),
              duration(now - f.dataFrom().getTime()) + " old · " + (f.everLive ? "reconnecting" : "connecting"));
      }
      return;
    }
    if (now - f.heardAt > SILENT_AFTER_MS) {
      write("stale", "Stale since " + clock(new Date(f.heardAt), false),
            "no word from the server for " + duration(now - f.heardAt));
      return;
    }
    if (f.problem) {
      write("stale", f.problem.since ? "Stale since " + clock(f.problem.since, false) + " (" + f.problem.why + ")"
                                     : "Stale: " + f.problem.why,
            "server answered " + clock(new Date(f.heardAt), true));
      return;
    }
    // A relist being written: live, but the counts are not whole yet (the words say so).
    write("live", f.partial ? "Live, counts partial" : "Live",
          (f.partial ? f.partial + " · " : "") + "updated " + clock(new Date(f.heardAt), true));
  }

  window.akriMark = {
    // The page's feed (one per page; a second call returns the same one).
    feed: function () {
      if (!current) {
        current = new Feed();
        render();
        ticker = setInterval(render, 1000);
      }
      return current;
    },
    // fn(state) after every change of state (live.js disables Release links while stale).
    onChange: function (fn) { listeners.push(fn); },
    state: function () { return elements() ? mark.dataset.state : null; },
  };
})();
