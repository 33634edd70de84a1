// The answer form's arrays (templates/_form.html): add and remove items in the browser.
//
// Items are named ARRAY.0, ARRAY.1, ... and the server reads them in index order, so after an
// add or a remove every item of that array is renumbered: each attribute that carries a field's
// name (name, id / for "f-NAME", "d-NAME", "e-NAME", data-name, data-for, aria-describedby)
// has its prefix ARRAY.OLD replaced by ARRAY.NEW, inside nested arrays and their <template>s
// too. Without this script the add / remove buttons stay hidden and the rendered items are the
// form (the server renders minItems items, or one empty one, which is dropped when left empty).
(function () {
  "use strict";

  var NAMED = ["name", "data-name", "data-for"];
  var ID_LIKE = ["id", "for"];
  var ID_PREFIXES = ["f-", "d-", "e-"];

  function renamed(value, from, to) {
    if (value === from || value.indexOf(from + ".") === 0) {
      return to + value.slice(from.length);
    }
    return null;
  }

  function renamedId(value, from, to) {
    for (var i = 0; i < ID_PREFIXES.length; i++) {
      var prefix = ID_PREFIXES[i];
      if (value.indexOf(prefix) === 0) {
        var rest = renamed(value.slice(prefix.length), from, to);
        if (rest !== null) {
          return prefix + rest;
        }
      }
    }
    return null;
  }

  function renameElement(element, from, to) {
    var i, value, next;
    for (i = 0; i < NAMED.length; i++) {
      value = element.getAttribute(NAMED[i]);
      next = value === null ? null : renamed(value, from, to);
      if (next !== null) {
        element.setAttribute(NAMED[i], next);
      }
    }
    for (i = 0; i < ID_LIKE.length; i++) {
      value = element.getAttribute(ID_LIKE[i]);
      next = value === null ? null : renamedId(value, from, to);
      if (next !== null) {
        element.setAttribute(ID_LIKE[i], next);
      }
    }
    value = element.getAttribute("aria-describedby");
    if (value !== null) {
      element.setAttribute("aria-describedby", value.split(/\s+/).map(function (id) {
        var moved = renamedId(id, from, to);
        return moved === null ? id : moved;
      }).join(" "));
    }
    if (element.tagName === "TEMPLATE") {
      renameWithin(element.content, from, to);
    }
  }

  function renameWithin(node, from, to) {
    var elements = node.querySelectorAll("*");
    for (var i = 0; i < elements.length; i++) {
      renameElement(elements[i], from, to);
    }
  }

  function itemsOf(array) {
    var list = array.querySelector(":scope > ol.array-items");
    return list ? Array.prototype.slice.call(list.children) : [];
  }

  function renumber(array) {
    var name = array.getAttribute("data-name");
    var items = itemsOf(array);
    items.forEach(function (item, index) {
      var from = item.getAttribute("data-name");
      var to = name + "." + index;
      if (from !== to) {
        renameElement(item, from, to);
        renameWithin(item, from, to);
      }
      var number = item.querySelector(".item-number");
      if (number) {
        number.textContent = String(index + 1);
      }
    });
    var min = parseInt(array.getAttribute("data-min-items") || "0", 10);
    var maxText = array.getAttribute("data-max-items");
    var max = maxText === null ? Infinity : parseInt(maxText, 10);
    var add = array.querySelector(":scope > button.add-item");
    if (add) {
      add.disabled = items.length >= max;
    }
    items.forEach(function (item) {
      var remove = item.querySelector(":scope > button.remove-item");
      if (remove) {
        remove.disabled = items.length <= min;
      }
    });
  }

  function enable(root) {
    var arrays = root.querySelectorAll("fieldset.field-array");
    for (var i = 0; i < arrays.length; i++) {
      var buttons = arrays[i].querySelectorAll(
        ":scope > button.add-item, :scope > ol.array-items > li > button.remove-item");
      for (var j = 0; j < buttons.length; j++) {
        buttons[j].hidden = false;
      }
      renumber(arrays[i]);
    }
  }

  function add(array) {
    var template = array.querySelector(":scope > template.array-item-template");
    var list = array.querySelector(":scope > ol.array-items");
    if (!template || !list) {
      return;
    }
    var fragment = document.importNode(template.content, true);
    var item = fragment.querySelector("li.array-item");
    list.appendChild(fragment);
    enable(item);
    var own = item.querySelector(":scope > button.remove-item");
    if (own) {
      own.hidden = false;
    }
    renumber(array);
    var first = item.querySelector("input, select, textarea");
    if (first) {
      first.focus();
    }
  }

  function remove(item) {
    var array = item.closest("fieldset.field-array");
    item.remove();
    if (array) {
      renumber(array);
    }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.add-item, button.remove-item");
    if (!button || !button.closest(".answer-fields")) {
      return;
    }
    event.preventDefault();
    if (button.classList.contains("add-item")) {
      add(button.closest("fieldset.field-array"));
    } else {
      remove(button.closest("li.array-item"));
    }
  });

  function start() {
    var forms = document.querySelectorAll(".answer-fields");
    for (var i = 0; i < forms.length; i++) {
      enable(forms[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
