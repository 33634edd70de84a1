// The inbox's live parts, on top of pages that work without them (progressive enhancement):
// the ages and deadlines tick every second, the list follows interrupts raised and answered
// elsewhere, and an interrupt's page says when its interrupt went away. Vanilla, no build.
//
// Events (server-sent, GET /events with the page's filters): `raised` {session, interrupt_id,
// html}: the row, for the rows this page's filters show; `gone` {session, interrupt_id,
// timed_out, type}; `reset`: the page missed changes, reload it; `hello` once the stream is open.
//
// The stream's URL carries `since`: the server's time when it rendered this page. The server
// replays the changes from then on (those between the render and the stream's start), and so
// again after a reconnect, as the browser reuses the URL; it sends `reset` when it no longer has
// them all. A replayed change already shown is skipped (a row already there, a gone row absent).
(function () {
  "use strict";

  // The server's clock, not the browser's: a deadline is the engine's (body[data-now] is the
  // server's time when it rendered the page).
  var skewMs = 0;
  // the server's time at the render (body[data-now]), when it says
  var renderedAt = null;
  var loadedAt = Date.now();
  // A page reset right after it loaded waits this long before it reloads: a server that cannot
  // replay yet (a shard not read since its start) makes no reload loop.
  var MIN_RELOAD_GAP_MS = 5000;

  // `path` with the page's render time as `since` (without one, the server starts from now)
  function withSince(path) {
    if (renderedAt === null) return path;
    return path + (path.indexOf("?") < 0 ? "?" : "&") + "since=" + encodeURIComponent(String(renderedAt));
  }

  function serverNow() {
    return Date.now() + skewMs;
  }

  function pad(n) {
    return n < 10 ? "0" + n : String(n);
  }

  // The same spans as the server renders them (parley/web/present.py `duration`):
  // 42s, 3m 05s, 2h 07m, 3d 4h.
  function duration(ms) {
    var seconds = Math.floor(Math.max(0, ms) / 1000);
    if (seconds < 60) return seconds + "s";
    var minutes = Math.floor(seconds / 60);
    seconds = seconds % 60;
    if (minutes < 60) return minutes + "m " + pad(seconds) + "s";
    var hours = Math.floor(minutes / 60);
    minutes = minutes % 60;
    if (hours < 24) return hours + "h " + pad(minutes) + "m";
    return Math.floor(hours / 24) + "d " + (hours % 24) + "h";
  }

  function msOf(value) {
    var n = Number(value);
    return value !== undefined && value !== "" && isFinite(n) ? n : null;
  }

  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  // ---- (1) ages and countdowns, every second

  function tick() {
    var now = serverNow();
    var i;
    var countdowns = document.querySelectorAll("span.countdown[data-expires-at]");
    for (i = 0; i < countdowns.length; i++) {
      var expires = msOf(countdowns[i].dataset.expiresAt);
      if (expires === null) continue;
      var passed = expires <= now;
      setText(countdowns[i], passed ? "passed" : "in " + duration(expires - now));
      countdowns[i].classList.toggle("passed", passed);
    }
    var ages = document.querySelectorAll(".age");
    for (i = 0; i < ages.length; i++) {
      // its own data-raised-at, else its row's
      var holder = ages[i].hasAttribute("data-raised-at") ? ages[i] : ages[i].closest("[data-raised-at]");
      var raised = holder ? msOf(holder.dataset.raisedAt) : null;
      if (raised === null) continue;
      setText(ages[i], duration(now - raised) + " ago");
    }
  }

  // ---- the event stream

  function connect(url, handlers) {
    var source = new EventSource(withSince(url));
    function connected() {
      document.body.dataset.live = "connected";
    }
    // `hello` is the server's first frame, sent once it has subscribed: from then on nothing
    // is missed (the connection's `open` comes before that)
    source.addEventListener("hello", connected);
    source.addEventListener("error", function () {
      // the browser reconnects by itself (after the stream's `retry`) unless it gave up
      document.body.dataset.live = source.readyState === EventSource.CLOSED ? "closed" : "reconnecting";
    });
    Object.keys(handlers).forEach(function (name) {
      source.addEventListener(name, function (event) {
        var data;
        try {
          data = JSON.parse(event.data);
        } catch (e) {
          return; // not ours to act on
        }
        handlers[name](data);
      });
    });
    source.addEventListener("reset", function () {
      source.close();
      document.body.dataset.live = "reloading";
      window.setTimeout(function () {
        location.reload();
      }, Math.max(0, loadedAt + MIN_RELOAD_GAP_MS - Date.now()));
    });
    // leaving the page ends its stream at once (the server forgets the subscriber)
    window.addEventListener("pagehide", function () {
      source.close();
    });
    return source;
  }

  // Matched by the dataset's values, never by a selector built from them: a session id may
  // hold any printable character.
  function isRow(el, session, interruptId) {
    return el.dataset.session === session && el.dataset.interrupt === interruptId;
  }

  // ---- (2) the list

  function listPage(table) {
    var tbody = table.tBodies[0] || table.appendChild(document.createElement("tbody"));
    var query = new URLSearchParams(location.search);
    var orderField = document.querySelector("form#filters [name=order]");
    var order = table.dataset.order || query.get("order") || (orderField && orderField.value) || "oldest";
    var firstPage = !query.get("cursor");
    // where #empty was, to show it again there once the last row goes
    var emptyHome = null;
    // a screen reader hears what the live list did (the rows themselves change silently)
    var live = document.getElementById("live-status");
    var bulkButton = document.getElementById("answer-selected");

    function announce(text) {
      if (live) live.textContent = text;
    }

    // the bulk button says how many are picked, and is off with none
    function updateBulk() {
      if (!bulkButton) return;
      var n = tbody.querySelectorAll("input[name=pick]:checked").length;
      bulkButton.disabled = n === 0;
      bulkButton.textContent = n ? "Answer the " + n + " selected together" : "Answer the selected questions together";
    }
    tbody.addEventListener("change", updateBulk);
    updateBulk();

    function rows() {
      return tbody.querySelectorAll("tr.interrupt");
    }

    function findRow(session, interruptId) {
      var all = rows();
      for (var i = 0; i < all.length; i++) {
        if (isRow(all[i], session, interruptId)) return all[i];
      }
      return null;
    }

    function hideEmpty() {
      var empty = document.getElementById("empty");
      if (!empty) return;
      emptyHome = { node: empty, parent: empty.parentNode, next: empty.nextSibling };
      empty.remove();
    }

    function showEmpty() {
      if (document.getElementById("empty")) return;
      var empty;
      if (emptyHome) {
        empty = emptyHome.node;
        var next = emptyHome.next && emptyHome.next.parentNode === emptyHome.parent ? emptyHome.next : null;
        emptyHome.parent.insertBefore(empty, next);
      } else {
        empty = document.createElement("p");
        empty.id = "empty";
        empty.className = "empty";
        empty.textContent = "No open questions.";
        table.parentNode.insertBefore(empty, table.nextSibling);
      }
      empty.hidden = false;
    }

    function rowOf(html) {
      var template = document.createElement("template");
      template.innerHTML = html.trim();
      var row = template.content.querySelector("tr");
      return row && row.classList.contains("interrupt") ? row : null;
    }

    connect("/events" + location.search, {
      raised: function (data) {
        if (typeof data.html !== "string" || findRow(data.session, data.interrupt_id)) return;
        var newest = order === "newest";
        if (newest ? !firstPage : document.getElementById("next-page")) return; // another page's
        var row = rowOf(data.html);
        if (!row) return;
        // A replayed raise (the page asks for changes since it was rendered, with a margin) may
        // be of a row already listed on an earlier page: a row older than this page's first
        // (oldest first, not the first page) is not this page's. Otherwise it goes in its place
        // by raise time.
        var raised = msOf(row.dataset.raisedAt) || 0;
        var listed = rows();
        if (!newest && !firstPage && listed.length && raised < (msOf(listed[0].dataset.raisedAt) || 0)) return;
        // likewise, newest first with later pages: a row older than this page's last is theirs
        var last = listed.length ? listed[listed.length - 1] : null;
        if (newest && last && document.getElementById("next-page")
            && raised < (msOf(last.dataset.raisedAt) || 0)) return;
        var before = null;
        for (var i = 0; i < listed.length; i++) {
          var at = msOf(listed[i].dataset.raisedAt) || 0;
          if (newest ? raised > at : raised < at) {
            before = listed[i];
            break;
          }
        }
        tbody.insertBefore(row, before);
        row.classList.add("arrived");
        hideEmpty();
        tick();
        announce("New question: " + (row.dataset.reason || "") + " in " + (row.dataset.session || ""));
      },
      gone: function (data) {
        var row = findRow(data.session, data.interrupt_id);
        if (!row) return;
        row.remove();
        if (rows().length === 0) showEmpty();
        updateBulk();
        announce("Question " + (row.dataset.reason || "") + " left the list: " + (data.timed_out === true
          ? "its deadline passed" : data.type === "interrupt.cancelled" ? "its session was closed" : "it was answered"));
      },
    });
  }

  // ---- (3) one interrupt's page

  function interruptPage(main) {
    var session = main.dataset.session;
    var interruptId = main.dataset.interrupt;

    // This page's own answer ended it (the page shows the outcome): not news from elsewhere.
    function answeredHere() {
      var outcome = document.getElementById("outcome");
      var status = outcome ? outcome.dataset.status : "";
      return status === "delivered" || status === "not_delivered";
    }

    function showGone(data) {
      if (answeredHere() || document.getElementById("not-open")) return;
      var notice = document.getElementById("gone-notice");
      if (!notice) {
        notice = document.createElement("p");
        notice.id = "gone-notice";
        notice.className = "notice";
        notice.setAttribute("role", "status");
        main.insertBefore(notice, main.firstChild);
      }
      notice.textContent = data.timed_out === true ? "Its deadline passed"
        : data.type === "interrupt.cancelled" ? "Its session was closed"
        : "This interrupt was answered elsewhere";
      notice.hidden = false;
      var form = document.getElementById("answer");
      if (form) {
        var controls = form.querySelectorAll("button, input[type=submit]");
        for (var i = 0; i < controls.length; i++) controls[i].disabled = true;
      }
    }

    connect("/events?session=" + encodeURIComponent(session), {
      gone: function (data) {
        if (data.session === session && data.interrupt_id === interruptId) showGone(data);
      },
    });
  }

  function start() {
    var now = msOf(document.body.dataset.now);
    if (now !== null) skewMs = now - Date.now();
    renderedAt = now;
    tick();
    window.setInterval(tick, 1000);
    if (!window.EventSource) return; // the page still works: reload to see what changed
    var table = document.querySelector("table#interrupts");
    if (table) {
      listPage(table);
      return;
    }
    var main = document.querySelector("main[data-session][data-interrupt]");
    if (main) interruptPage(main);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
