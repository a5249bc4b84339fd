// The Instance page's broker block: re-read every few seconds while the page is open.
// Broker pods change phase at the kubelet's pace, so a short poll of the server-rendered
// block is live enough; the block says when it was last read, or that it could not be.
(function () {
  "use strict";
  var PERIOD_MS = 3000;
  function refresh() {
    var block = document.getElementById("brokers");
    if (!block) return;
    fetch(block.dataset.brokersRefresh, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (answer) {
        if (!answer.ok) throw new Error("HTTP " + answer.status);
        return answer.text();
      })
      .then(function (html) {
        var holder = document.createElement("div");
        holder.innerHTML = html;
        var fresh = holder.querySelector("#brokers");
        if (!fresh) return;
        block.replaceWith(fresh);
        if (window.akriTimes) window.akriTimes.render(fresh);
      })
      .catch(function (error) {
        var mark = block.querySelector("[data-brokers-state]");
        if (mark) mark.textContent = "Stale: could not refresh (" + error.message + "); retrying";
      })
      .finally(function () { setTimeout(refresh, PERIOD_MS); });
  }
  setTimeout(refresh, PERIOD_MS);
})();
