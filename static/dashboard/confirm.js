// Destructive confirmation: Cancel has the focus, whatever the browser does with autofocus.
"use strict";
(function () {
  var cancel = document.getElementById("release-cancel");
  if (cancel) cancel.focus();
})();
