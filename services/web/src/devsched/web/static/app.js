// devsched-web: keeps the live regions current from server-sent events. No framework, no build step.
// The server renders every fragment (autoescaped); this file only swaps them in, appends log text with
// textContent, and asks for confirmation before an action.
(function () {
  "use strict";
  var status = document.getElementById("live-status");

  function say(text) {
    if (status) { status.textContent = text; }
  }

  // What the operator has typed into a region's fields (a drain reason, say), keyed by form and name, so
  // that a swap, even the first one right after the page loads, does not throw it away.
  function fieldKey(field) {
    var form = field.form;
    return (form ? form.getAttribute("action") : "") + "#" + field.name;
  }

  function keep(region) {
    var typed = {};
    region.querySelectorAll("input[name], textarea[name]").forEach(function (field) {
      if (field.type !== "hidden" && field.value !== field.defaultValue) { typed[fieldKey(field)] = field.value; }
    });
    return typed;
  }

  function restore(region, typed) {
    region.querySelectorAll("input[name], textarea[name]").forEach(function (field) {
      var key = fieldKey(field);
      if (field.type !== "hidden" && Object.prototype.hasOwnProperty.call(typed, key)) { field.value = typed[key]; }
    });
  }

  function start() {
  document.querySelectorAll("[data-live]").forEach(function (region) {
    var source = new EventSource(region.getAttribute("data-live"));
    source.addEventListener("fragment", function (e) {
      var focused = document.activeElement && document.activeElement.id;
      var typed = keep(region);
      region.innerHTML = e.data;
      restore(region, typed);
      if (focused) {
        var again = document.getElementById(focused);
        if (again) { again.focus(); }
      }
      say("live · updated " + new Date().toLocaleTimeString());
    });
    source.addEventListener("end", function () { source.close(); say("final"); });
    source.addEventListener("gone", function () { source.close(); say("gone"); });
    source.onerror = function () { say("reconnecting…"); };
  });

  document.querySelectorAll("[data-log]").forEach(function (pre) {
    var source = new EventSource(pre.getAttribute("data-log"));
    source.addEventListener("output", function (e) {
      var follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(JSON.parse(e.data)));
      if (follow) { pre.scrollTop = pre.scrollHeight; }
    });
    source.addEventListener("end", function () { source.close(); pre.setAttribute("data-ended", "true"); });
  });
  }

  // Streams open after the load event: one opened earlier keeps the page "loading" for as long as it lives.
  if (document.readyState === "complete") { start(); } else { window.addEventListener("load", start); }

  document.addEventListener("submit", function (e) {
    var form = e.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { e.preventDefault(); }
  });
})();
