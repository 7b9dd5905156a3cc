// The fencepost dashboard: a read-only view over the JSON API of `fencepost ui`.
//
// Everything shown comes from the ledger and is user data (ids, workflow refs, scope keys,
// JSON documents), so the DOM is built with createElement and textContent only: no string of
// the API's ever reaches innerHTML, an attribute handler or a URL other than our own `#/`
// routes (which are built with encodeURIComponent). The server's Content-Security-Policy
// allows this file and the stylesheet only, as a second fence.
"use strict";

(function () {
  const main = document.getElementById("main");
  const errorBox = document.getElementById("error");
  let meta = null;
  // What the current page must stop when another one is shown (streams, timers).
  let teardown = [];
  // Bumped on every navigation, so a slow answer for a page that is gone is dropped.
  let generation = 0;

  // ---------------------------------------------------------------- DOM helpers

  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    setProps(el, props);
    add(el, kids);
    return el;
  }

  function svg(tag, attrs, ...kids) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") el.setAttribute("class", v);
      else el.setAttribute(k, String(v));
    }
    add(el, kids);
    return el;
  }

  function setProps(el, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = String(v);
      else if (k === "data") Object.assign(el.dataset, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "value") el.value = v;
      else if (k === "checked") el.checked = !!v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function add(el, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
  }

  // A link to one of our own pages: the hash is built here, the data only encoded into it.
  function route(page, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
      else if (v !== null && v !== undefined && v !== "" && v !== false) q.set(k, String(v));
    }
    const s = q.toString();
    return "#/" + page + (s ? "?" + s : "");
  }

  function runLink(runId, text) {
    return h("a", { class: "id", href: route("run", { id: runId }), title: runId }, text || runId);
  }

  function unitLink(runId, unitId) {
    return h("a", { class: "id unit-link", href: route("unit", { run: runId, unit: unitId }), title: unitId }, unitId);
  }

  function pill(status, extra) {
    return h("span", { class: "pill s-" + String(status).replace(/[^a-z_]/g, "") }, status, extra);
  }

  const pad = (n, w) => String(n).padStart(w || 2, "0");

  // Local time as 2026-12-05 17:41:22 (the exact UTC time in the tooltip).
  function stamp(iso) {
    const d = new Date(iso);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + clock(iso);
  }

  function clock(iso, ms) {
    const d = new Date(iso);
    const hms = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    return ms ? hms + "." + pad(d.getMilliseconds(), 3) : hms;
  }

  function time(iso) {
    if (!iso) return h("span", { class: "muted" }, "–");
    return h("time", { datetime: iso, title: iso }, stamp(iso));
  }

  function ago(iso, nowMs) {
    if (!iso) return h("span", { class: "muted" }, "–");
    const ms = new Date(iso).getTime() - (nowMs || Date.now());
    return h("time", { datetime: iso, title: iso }, relative(ms));
  }

  function relative(ms) {
    const s = Math.round(Math.abs(ms) / 1000);
    let text;
    if (s < 60) text = s + " s";
    else if (s < 3600) text = Math.round(s / 60) + " min";
    else if (s < 86400) text = (s / 3600).toFixed(1) + " h";
    else text = (s / 86400).toFixed(1) + " d";
    return ms >= 0 ? "in " + text : text + " ago";
  }

  function num(n) {
    return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
  }

  function dash(v) {
    return v === null || v === undefined || v === "" ? h("span", { class: "muted" }, "–") : v;
  }

  function table(headers, rows, opts) {
    const o = opts || {};
    return h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: o.class || "" },
        h("thead", null, h("tr", null, headers.map((x) => h("th", null, x)))),
        h(
          "tbody",
          null,
          rows.length
            ? rows
            : h("tr", null, h("td", { class: "empty", colspan: headers.length }, o.empty || "Nothing here."))
        )
      )
    );
  }

  function card(label, value, opts) {
    const o = opts || {};
    return h(
      "div",
      { class: "card" + (o.alert ? " alert" : "") + (o.warn ? " warn" : ""), data: o.data },
      h("div", { class: "card-value" }, value),
      h("div", { class: "card-label" }, label),
      o.note ? h("div", { class: "card-note" }, o.note) : null
    );
  }

  function section(title, ...kids) {
    return h("section", { class: "panel" }, h("h2", null, title), kids);
  }

  function kv(pairs) {
    return h(
      "dl",
      { class: "kv" },
      pairs.map(([k, v]) => [h("dt", null, k), h("dd", null, dash(v))])
    );
  }

  function jsonBlock(text) {
    return h("pre", { class: "json" }, text === null || text === undefined ? "null" : text);
  }

  // ---------------------------------------------------------------- the API

  async function api(path, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
      else if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
    }
    const url = "/api/" + path + (q.toString() ? "?" + q.toString() : "");
    let res;
    try {
      res = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (e) {
      throw new Error("the dashboard server is not answering (" + e.message + ")");
    }
    let body = null;
    try {
      body = await res.json();
    } catch (e) {
      body = null;
    }
    if (!res.ok) {
      throw new Error((body && body.error) || "HTTP " + res.status);
    }
    return body;
  }

  function showError(message) {
    if (!message) {
      errorBox.hidden = true;
      errorBox.textContent = "";
      return;
    }
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  // ---------------------------------------------------------------- router

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const at = raw.indexOf("?");
    const page = (at < 0 ? raw : raw.slice(0, at)) || "runs";
    const params = new URLSearchParams(at < 0 ? "" : raw.slice(at + 1));
    return { page, params };
  }

  const pages = {};

  async function render() {
    for (const stop of teardown) stop();
    teardown = [];
    const mine = ++generation;
    const { page, params } = parseHash();
    for (const a of document.querySelectorAll("#nav a")) {
      const current = a.dataset.page === page || (page === "run" && a.dataset.page === "runs");
      a.classList.toggle("current", current);
    }
    showError("");
    const draw = pages[page] || pages.runs;
    const view = h("div", { class: "page page-" + page });
    clear(main);
    main.appendChild(view);
    main.dataset.page = page;
    main.dataset.ready = "false";
    try {
      await draw(view, params, () => mine === generation);
    } catch (e) {
      if (mine === generation) showError(e.message);
    }
    if (mine === generation) main.dataset.ready = "true";
  }

  function go(page, params) {
    const next = route(page, params);
    if (location.hash === next) render();
    else location.hash = next;
  }

  // ---------------------------------------------------------------- runs

  // A datetime-local input's value (local wall time) for an ISO time, and back to UTC ISO.
  function localInput(isoTime) {
    if (!isoTime) return "";
    const d = new Date(isoTime);
    if (isNaN(d.getTime())) return "";
    return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
  }

  function utcParam(local) {
    if (!local) return null;
    const d = new Date(local);
    return isNaN(d.getTime()) ? null : d.toISOString();
  }

  pages.runs = async function (view, params, live) {
    const statuses = params.getAll("status");
    const scope = params.get("scope") || "";
    const workflow = params.get("workflow") || "";
    const children = params.get("children") === "1";
    const limit = params.get("limit") || "50";
    const after = params.get("after") || "";
    const name = params.get("name") || "";
    const since = params.get("updated_after") || "";
    const until = params.get("updated_before") || "";

    const statusSel = h(
      "select",
      { name: "status", "aria-label": "status" },
      h("option", { value: "" }, "any status"),
      meta.run_statuses.map((s) => h("option", { value: s }, s))
    );
    statusSel.value = statuses[0] || "";
    const scopeIn = h("input", { name: "scope", placeholder: "scope key", value: scope });
    const wfIn = h("input", { name: "workflow", placeholder: "workflow ref", value: workflow });
    const nameIn = h("input", { name: "name", placeholder: "workflow name", value: name });
    const sinceIn = h("input", { type: "datetime-local", name: "updated_after", "aria-label": "updated from", title: "updated at or after", value: localInput(since) });
    const untilIn = h("input", { type: "datetime-local", name: "updated_before", "aria-label": "updated before", title: "updated before", value: localInput(until) });
    const childIn = h("input", { type: "checkbox", name: "children", checked: children });
    const limitSel = h(
      "select",
      { name: "limit", "aria-label": "page size" },
      ["25", "50", "100", "200"].map((n) => h("option", { value: n }, n + " per page"))
    );
    limitSel.value = limit;
    const apply = (e) => {
      if (e) e.preventDefault();
      go("runs", {
        status: statusSel.value || null,
        scope: scopeIn.value.trim(),
        workflow: wfIn.value.trim(),
        name: nameIn.value.trim(),
        updated_after: utcParam(sinceIn.value),
        updated_before: utcParam(untilIn.value),
        children: childIn.checked ? "1" : null,
        limit: limitSel.value === "50" ? null : limitSel.value,
      });
    };
    statusSel.addEventListener("change", apply);
    limitSel.addEventListener("change", apply);
    childIn.addEventListener("change", apply);
    const form = h(
      "form",
      { class: "filters", onsubmit: apply },
      statusSel,
      nameIn,
      scopeIn,
      wfIn,
      sinceIn,
      untilIn,
      h("label", { class: "check" }, childIn, " child runs"),
      limitSel,
      h("button", { type: "submit" }, "Filter"),
      statuses.length || scope || workflow || children || name || since || until
        ? h("a", { href: route("runs"), class: "reset" }, "clear filters")
        : null
    );
    // A run id or its first characters: one run opens its page, several are listed.
    const findIn = h("input", { name: "prefix", id: "find-run", placeholder: "run id or prefix", "aria-label": "find a run by id" });
    const found = h("div", { id: "find-result" });
    const find = async (e) => {
      e.preventDefault();
      const prefix = findIn.value.trim();
      if (!prefix) return;
      const hit = await api("find", { prefix });
      if (!live()) return;
      if (hit.run_id) return go("run", { id: hit.run_id });
      clear(found);
      found.appendChild(
        hit.matches.length
          ? h("p", { class: "muted" }, hit.matches.length + (hit.matches.length >= 100 ? "+" : "") + " runs start with ", h("code", null, prefix), ": ", hit.matches.map((m, i) => [i ? ", " : "", runLink(m)]))
          : h("p", { class: "muted" }, "No run id starts with ", h("code", null, prefix), ".")
      );
    };
    const finder = h("form", { class: "filters", id: "find-form", onsubmit: (e) => find(e).catch((err) => live() && showError(err.message)) }, findIn, h("button", { type: "submit" }, "Find"));
    view.appendChild(h("div", { class: "head" }, h("h1", null, "Runs"), finder, form));
    view.appendChild(found);

    const data = await api("runs", { status: statuses, scope, workflow, name, updated_after: since, updated_before: until, children: children ? "1" : "", limit, after });
    if (!live()) return;
    // Every run by status (children included), each counted up to count_max: a card filters.
    view.appendChild(
      h(
        "div",
        { class: "cards small", id: "run-totals" },
        Object.entries(data.totals).map(([s, n]) =>
          h("a", { class: "card-link", href: route("runs", { status: s }), data: { status: s } }, card(s, atLeast(n, data.count_max), { data: { k: s } }))
        )
      )
    );
    const rows = data.runs.map((r) =>
      h(
        "tr",
        { data: { run: r.run_id } },
        h("td", { class: "nowrap" }, runLink(r.run_id)),
        h("td", null, pill(r.status)),
        h("td", { class: "wf" }, r.workflow_ref),
        h("td", null, dash(r.scope_key)),
        h("td", null, dash(r.current_step_id)),
        h("td", { class: "n" }, num(r.revision)),
        h("td", null, ago(r.updated_at)),
        h("td", null, r.parent_run_id ? runLink(r.parent_run_id, "parent") : dash(null))
      )
    );
    view.appendChild(
      h(
        "section",
        { class: "panel flush" },
        table(["Run", "Status", "Workflow", "Scope", "Step", "Rev", "Updated", ""], rows, {
          class: "runs",
          empty: "No runs match.",
        })
      )
    );
    const base = { status: statuses, scope, workflow, name, updated_after: since, updated_before: until, children: children ? "1" : null, limit: limit === "50" ? null : limit };
    view.appendChild(
      h(
        "div",
        { class: "pager" },
        after ? h("a", { href: route("runs", base), class: "button" }, "« First page") : null,
        after ? h("a", { href: "#", class: "button", onclick: (e) => { e.preventDefault(); history.back(); } }, "‹ Back") : null,
        h("span", { class: "muted" }, data.runs.length + " runs" + (after ? " (after " + after + ")" : "")),
        data.next ? h("a", { href: route("runs", { ...base, after: data.next }), class: "button", rel: "next" }, "Next page ›") : null
      )
    );
  };

  // ---------------------------------------------------------------- one run

  pages.run = async function (view, params, live) {
    const runId = params.get("id") || "";
    const unitQuery = {
      run: runId,
      step: params.get("step") || "",
      status: params.get("ustatus") || "",
      after: params.get("uafter") || "",
      limit: 50,
    };
    // The run and a page of its units at once: the server reads them side by side.
    const units = api("units", unitQuery);
    units.catch(() => null);
    const data = await api("run", { id: runId });
    if (!live()) return;
    const run = data.run;
    const lease = data.lease;

    view.appendChild(
      h(
        "div",
        { class: "head" },
        h("h1", null, h("span", { class: "crumb" }, h("a", { href: route("runs") }, "Runs"), " / "), h("span", { class: "id", id: "run-id" }, run.run_id)),
        h(
          "div",
          { class: "sub" },
          pill(run.status),
          " ",
          h("span", { class: "wf" }, run.workflow_ref),
          run.scope_key ? [" in scope ", h("span", { class: "id" }, run.scope_key)] : null,
          " · ",
          h("a", { href: route("retries", { run: run.run_id }), id: "run-retries" }, "due units"),
          " · ",
          h("a", { href: route("retries", { run: run.run_id, kind: "exhausted" }) }, "exhausted units")
        )
      )
    );

    // The fence, first: who holds the run, and what the fence has done on it.
    const fencing = h(
      "section",
      { class: "panel fencing", id: "fencing" },
      h("h2", null, "Lease and fencing"),
      h(
        "div",
        { class: "cards" },
        card("lease generation", num(lease.generation), { data: { k: "generation" } }),
        card("owner", lease.owner_id ? h("span", { class: "id" }, lease.owner_id) : "none", {
          note: lease.owner_id ? [pill(lease.state), " ", lease.remaining_ms === null ? "" : relative(lease.remaining_ms)] : lease.generation ? "released" : "never claimed",
        }),
        card("takeovers", num(lease.takeovers), {
          alert: lease.takeovers > 0,
          note: "claims that took the lease after another owner's expired",
          data: { k: "takeovers" },
        }),
        card("refused stale writes", num(lease.refused_writes), {
          alert: lease.refused_writes > 0,
          note: "fenced writes refused: their claim no longer held the lease",
          data: { k: "refused_writes" },
        })
      )
    );
    view.appendChild(fencing);

    // Steps as a timeline.
    const steps = h(
      "ol",
      { class: "timeline" },
      data.steps.map((s) =>
        h(
          "li",
          { class: "step s-" + s.status + (s.step_id === run.current_step_id ? " current" : "") },
          h("div", { class: "dot" }),
          h("div", { class: "step-title" }, s.title || s.step_id),
          h("div", { class: "step-meta" }, h("span", { class: "id" }, s.step_id), " · ", s.status),
          s.completed_at ? h("div", { class: "step-meta" }, time(s.completed_at)) : null,
          s.summary ? h("div", { class: "step-note" }, s.summary) : null,
          s.notes ? h("div", { class: "step-note" }, s.notes) : null
        )
      )
    );
    view.appendChild(section("Steps", data.steps.length ? steps : h("p", { class: "muted" }, "No steps.")));

    // Units by status, accounting: each an aggregate over the whole run. Read at once for a
    // run of ordinary size; a very large run's are read when asked for, so opening its page
    // never starts a read that grows with the run.
    const unitsPanel = section("Units", h("p", { class: "muted" }, "Counting…"));
    const accPanel = section("Accounting", h("p", { class: "muted" }, "Adding up…"));
    view.appendChild(h("div", { class: "grid2" }, unitsPanel, accPanel));
    const fill = (panel, kids) => {
      while (panel.childNodes.length > 1) panel.removeChild(panel.lastChild);
      add(panel, [kids]);
    };
    const loadCounts = () =>
      api("run/totals", { run: run.run_id, part: "units" }).then(
        (counts) => {
          const total = counts.total;
          const bar = h("div", { class: "stack" });
          const legend = h("div", { class: "legend" });
          for (const [status, n] of Object.entries(counts.by_status)) {
            if (!n) continue;
            const seg = h("div", { class: "seg s-" + status, title: status + ": " + n });
            seg.style.width = (100 * n) / Math.max(total, 1) + "%";
            bar.appendChild(seg);
            legend.appendChild(h("span", null, pill(status), " ", num(n)));
          }
          fill(unitsPanel, [
            h("div", { class: "big", id: "unit-total" }, num(total), h("span", { class: "muted" }, " units")),
            total ? [bar, legend] : h("p", { class: "muted" }, "No units yet."),
          ]);
        },
        (e) => fill(unitsPanel, h("p", { class: "fail" }, e.message))
      );
    const loadAccounting = () =>
      api("run/totals", { run: run.run_id, part: "accounting" }).then(
        (acc) =>
          fill(
            accPanel,
            h(
              "div",
              { class: "cards small" },
              card("attempts", num(acc.total_attempts), { data: { k: "attempts" } }),
              card("tokens", num(acc.total_tokens)),
              card("dispatch attempts", num(acc.dispatch_attempts), { note: num(acc.dispatch_tokens) + " tokens" }),
              card("gate attempts", num(acc.gate_attempts), { note: num(acc.gate_tokens) + " tokens" })
            )
          ),
        (e) => fill(accPanel, h("p", { class: "fail" }, e.message))
      );
    const onDemand = (panel, what, load) => {
      const button = h("button", { type: "button", class: "totals-button" }, what);
      button.addEventListener("click", () => {
        fill(panel, h("p", { class: "muted" }, "Reading…"));
        load();
      });
      fill(panel, [
        h("p", { class: "muted" }, "A large run (" + num(run.revision) + " events): this reads every one of its units or attempts, so it runs when asked."),
        button,
      ]);
    };
    let totalsDone = Promise.resolve();
    if (run.revision <= meta.totals_auto_max_revision) {
      totalsDone = Promise.all([loadCounts(), loadAccounting()]);
    } else {
      onDemand(unitsPanel, "Count the units", loadCounts);
      onDemand(accPanel, "Add up attempts and tokens", loadAccounting);
    }

    view.appendChild(
      section(
        "Run",
        kv([
          ["run id", h("span", { class: "id" }, run.run_id)],
          ["workflow", h("span", null, h("span", { class: "wf" }, run.workflow_ref), " (", run.workflow_name, ")")],
          ["scope", run.scope_key],
          ["current step", run.current_step_id],
          ["parent", data.parent ? [runLink(data.parent.run_id), " ", pill(data.parent.status)] : null],
          ["parent unit", run.parent_unit_id],
          ["invocation key", run.invocation_key],
          ["session", run.origin_session_id],
          ["revision", num(run.revision)],
          ["created", time(run.created_at)],
          ["updated", time(run.updated_at)],
          ["completed", run.completed_at ? time(run.completed_at) : null],
          ["lease expires", lease.expires_at ? time(lease.expires_at) : null],
          ["last heartbeat", lease.heartbeat_at ? time(lease.heartbeat_at) : null],
        ]),
        h("div", { class: "grid2" }, h("div", null, h("h3", null, "params"), jsonBlock(run.params)), h("div", null, h("h3", null, "outputs"), jsonBlock(run.outputs)))
      )
    );

    if (data.children_total) {
      view.appendChild(
        section(
          "Child runs (" + num(data.children_total) + ")",
          table(
            ["Run", "Status", "Workflow", "Updated"],
            data.children.map((c) => h("tr", null, h("td", null, runLink(c.run_id)), h("td", null, pill(c.status)), h("td", { class: "wf" }, c.workflow_ref), h("td", null, ago(c.updated_at)))),
            {}
          ),
          data.children_total > data.children.length ? h("p", { class: "muted" }, "Showing the first " + data.children.length + ".") : null
        )
      );
    }

    view.appendChild(h("div", { class: "tail-link" }, h("a", { class: "button", href: route("tail", { run: run.run_id }) }, "Follow this run's events live ›")));

    // Units, paged, each with its attempts.
    const unitsBox = h("section", { class: "panel", id: "units" });
    view.appendChild(unitsBox);
    await drawUnits(unitsBox, run, data.steps, params, live, units);
    await totalsDone;
  };

  async function drawUnits(box, run, steps, params, live, pending) {
    const step = params.get("step") || "";
    const status = params.get("ustatus") || "";
    const after = params.get("uafter") || "";
    const stepSel = h("select", { "aria-label": "step" }, h("option", { value: "" }, "every step"), steps.map((s) => h("option", { value: s.step_id }, s.step_id)));
    stepSel.value = step;
    const statusSel = h("select", { "aria-label": "unit status" }, h("option", { value: "" }, "any status"), meta.unit_statuses.map((s) => h("option", { value: s }, s)));
    statusSel.value = status;
    const base = { id: run.run_id };
    const change = () => go("run", { ...base, step: stepSel.value, ustatus: statusSel.value });
    stepSel.addEventListener("change", change);
    statusSel.addEventListener("change", change);
    const expandAll = h("button", { type: "button", id: "expand-all" }, "Show all attempts");
    box.appendChild(h("div", { class: "panel-head" }, h("h2", null, "Units and attempts"), h("div", { class: "filters" }, stepSel, statusSel, expandAll)));

    const data = await pending;
    if (!live()) return;
    const body = [];
    const detailRows = [];
    for (const u of data.units) {
      const reclaims = u.history.reduce((n, a) => n + a.reclaims, 0);
      const generations = [...new Set(u.history.map((a) => a.lease_generation).filter((g) => g !== null))];
      const detail = h(
        "tr",
        { class: "attempts-row", hidden: true },
        h(
          "td",
          { colspan: 8 },
          table(
            ["#", "Dispatch id", "Status", "Holder", "Lease gen", "Reclaims", "Result / failure", "Tokens", "Started", "Took"],
            u.history.map((a) =>
              h(
                "tr",
                { class: "attempt" + (a.reclaims ? " reclaimed" : ""), data: { dispatch: a.dispatch_id } },
                h("td", { class: "n" }, a.attempt),
                h("td", { class: "id nowrap" }, a.dispatch_id),
                h("td", null, pill(a.status)),
                h("td", { class: "nowrap" }, dash(a.holder)),
                h("td", { class: "n" }, dash(a.lease_generation)),
                h("td", { class: "n" }, a.reclaims ? h("span", { class: "flag" }, "reclaimed ×" + a.reclaims) : "0"),
                h("td", { class: "result" }, a.failure_reason ? h("span", { class: "fail" }, a.failure_reason) : dash(a.result)),
                h("td", { class: "n" }, dash(a.tokens)),
                h("td", { class: "nowrap" }, time(a.started_at)),
                h("td", { class: "n" }, a.duration_ms === null ? dash(null) : num(a.duration_ms) + " ms")
              )
            ),
            { class: "inner" }
          ),
          u.attempts > u.history.length ? h("p", { class: "muted" }, "The latest " + u.history.length + " of " + u.attempts + " attempts.") : null
        )
      );
      detailRows.push(detail);
      const toggle = h("button", { type: "button", class: "link", "aria-expanded": "false" }, "▸ " + u.attempts + (u.attempts === 1 ? " attempt" : " attempts"));
      toggle.addEventListener("click", () => {
        detail.hidden = !detail.hidden;
        toggle.setAttribute("aria-expanded", String(!detail.hidden));
        toggle.textContent = (detail.hidden ? "▸ " : "▾ ") + u.attempts + (u.attempts === 1 ? " attempt" : " attempts");
      });
      body.push(
        h(
          "tr",
          { class: "unit", data: { unit: u.unit_id } },
          h("td", { class: "id" }, unitLink(run.run_id, u.unit_id)),
          h("td", null, dash(u.step_id)),
          h("td", null, pill(u.status)),
          h("td", null, toggle),
          h("td", null, dash(u.claim_holder)),
          h("td", null, reclaims ? h("span", { class: "flag", title: "reclaimed in place: same attempt, same dispatch id, a new lease generation" }, "reclaimed at gen " + generations.join(", ")) : generations.length ? "gen " + generations.join(", ") : dash(null)),
          h("td", { class: "n" }, dash(u.tokens)),
          h("td", { class: "result" }, u.failure_reason ? h("span", { class: "fail" }, u.failure_reason) : dash(u.result))
        ),
        detail
      );
    }
    expandAll.addEventListener("click", () => {
      const open = detailRows.some((r) => r.hidden);
      detailRows.forEach((r) => (r.hidden = !open));
      expandAll.textContent = open ? "Hide attempts" : "Show all attempts";
    });
    box.appendChild(table(["Unit", "Step", "Status", "Attempts", "Holder", "Lease", "Tokens", "Result / failure"], body, { class: "units", empty: "No units match." }));
    box.appendChild(
      h(
        "div",
        { class: "pager" },
        after ? h("a", { class: "button", href: route("run", { ...base, step, ustatus: status }) }, "« First units") : null,
        h("span", { class: "muted" }, data.units.length + " units" + (data.scanned !== null && data.scanned !== undefined ? " matching among " + num(data.scanned) + " looked through" : "") + (after ? " after " + after : "")),
        data.next ? h("a", { class: "button", href: route("run", { ...base, step, ustatus: status, uafter: data.next }) }, "Next units ›") : null
      )
    );
  }

  // ---------------------------------------------------------------- one unit

  // One unit's failures in full: every attempt's failure reason and result, the newest 100.
  pages.unit = async function (view, params, live) {
    const runId = params.get("run") || "";
    const unitId = params.get("unit") || "";
    const u = await api("unit", { run: runId, unit: unitId });
    if (!live()) return;
    view.appendChild(
      h(
        "div",
        { class: "head" },
        h("h1", null, h("span", { class: "crumb" }, h("a", { href: route("runs") }, "Runs"), " / ", runLink(runId), " / "), h("span", { class: "id", id: "unit-id" }, u.unit_id))
      )
    );
    view.appendChild(
      h(
        "div",
        { class: "cards small" },
        card("status", pill(u.status), { data: { k: "status" } }),
        card("attempts", num(u.attempts), { data: { k: "attempts" } }),
        card("step", dash(u.step_id)),
        card("retry", u.retry_at ? h("span", { title: u.retry_at }, clock(u.retry_at, true)) : dash(null), { data: { k: "retry" } })
      )
    );
    if (u.failure_reason) view.appendChild(section("Last failure", h("div", { class: "unit-failure", id: "unit-failure" }, u.failure_reason)));
    const rows = u.history
      .slice()
      .reverse()
      .map((a) =>
        h(
          "tr",
          { class: "attempt", data: { attempt: a.attempt, status: a.status } },
          h("td", { class: "n" }, a.attempt),
          h("td", null, pill(a.status)),
          h("td", { class: "id" }, a.dispatch_id),
          h("td", null, dash(a.holder)),
          h("td", { class: "n" }, dash(a.lease_generation)),
          h("td", null, h("time", { datetime: a.started_at, title: a.started_at }, clock(a.started_at, true))),
          h("td", { class: "n" }, a.duration_ms === null ? dash(null) : num(a.duration_ms) + " ms"),
          h("td", { class: "unit-failure" }, a.failure_reason ? h("span", { class: "fail" }, a.failure_reason) : dash(a.result))
        )
      );
    view.appendChild(
      section(
        "Attempts, newest first",
        table(["#", "Status", "Dispatch id", "Holder", "Gen", "Started", "Took", "Failure / result"], rows, { class: "unit-attempts", empty: "No attempt yet." }),
        u.attempts > u.shown ? h("p", { class: "muted" }, "The newest " + u.shown + " of " + num(u.attempts) + " attempts.") : null
      )
    );
  };

  // ---------------------------------------------------------------- leases

  function leaseRow(le, extra) {
    return h(
      "tr",
      { class: "lease", data: { run: le.run_id } },
      h("td", null, runLink(le.run_id)),
      extra || null,
      h("td", null, le.owner_id ? pill(le.state) : h("span", { class: "muted" }, "free")),
      h("td", { class: "n" }, num(le.generation)),
      h("td", null, le.owner_id ? h("span", { class: "id" }, le.owner_id) : dash(null)),
      h("td", null, le.remaining_ms === null ? dash(null) : h("span", { title: le.expires_at }, relative(le.remaining_ms))),
      h("td", null, le.heartbeat_at ? ago(le.heartbeat_at) : dash(null)),
      h("td", { class: "n" + (le.takeovers ? " hot" : "") }, num(le.takeovers)),
      h("td", { class: "n" + (le.refused_writes ? " hot" : "") }, num(le.refused_writes))
    );
  }

  const LEASE_HEAD = ["Run", "State", "Gen", "Owner", "Expires", "Heartbeat", "Takeovers", "Refused writes"];

  pages.leases = async function (view, params, live) {
    const after = params.get("after") || "";
    view.appendChild(h("div", { class: "head" }, h("h1", null, "Leases"), h("div", { class: "sub muted" }, "Refreshes every 5 s. Expiring: past two thirds of its term since the last heartbeat.")));
    const body = h("div");
    view.appendChild(body);
    const draw = async () => {
      const data = await api("leases", { after, limit: 50 });
      if (!live()) return;
      const c = data.counts;
      const fresh = h(
        "div",
        null,
        h(
          "div",
          { class: "cards" },
          card("live", num(c.live), { data: { k: "live" } }),
          card("expiring", num(c.expiring), { warn: c.expiring > 0, data: { k: "expiring" } }),
          card("expired", num(c.expired), { warn: c.expired > 0, data: { k: "expired" } }),
          card("blocking unfinished runs", num(c.blocking), { alert: c.blocking > 0, note: "expired leases on runs not yet finished", data: { k: "blocking" } })
        ),
        section("Owned now", table(LEASE_HEAD, data.owned.map((le) => leaseRow(le)), { empty: "No lease has an owner now." }), c.owned > data.owned.length ? h("p", { class: "muted" }, "The first " + data.owned.length + " of " + num(c.owned) + ", soonest to expire first.") : null),
        data.blocking.length ? section("Expired, blocking an unfinished run", table(LEASE_HEAD, data.blocking.map((le) => leaseRow(le)), {})) : null,
        section(
          "Recently updated runs",
          table(
            ["Run", "Run status", "State", "Gen", "Owner", "Expires", "Heartbeat", "Takeovers", "Refused writes"],
            data.recent.map((le) => leaseRow(le, h("td", null, pill(le.run_status)))),
            { class: "recent-leases" }
          ),
          h(
            "div",
            { class: "pager" },
            after ? h("a", { class: "button", href: route("leases") }, "« First page") : null,
            data.next ? h("a", { class: "button", href: route("leases", { after: data.next }) }, "Next page ›") : null
          )
        )
      );
      clear(body);
      body.appendChild(fresh);
    };
    await draw();
    const timer = setInterval(() => draw().catch((e) => live() && showError(e.message)), 5000);
    teardown.push(() => clearInterval(timer));
  };

  // ---------------------------------------------------------------- queue

  // A count the server stopped at: that many or more.
  function atLeast(n, max) {
    return n >= max ? num(max) + "+" : num(n);
  }

  pages.queue = async function (view, params, live) {
    const lane = params.get("lane") === "later" ? "later" : "due";
    const after = params.get("after") || "";
    const keysAfter = params.get("keys_after") || "";
    view.appendChild(h("div", { class: "head" }, h("h1", null, "Queue"), h("div", { class: "sub muted" }, "Refreshes every 5 s. What claim_next hands out next, what waits for its time, keys with limits, paused workflows.")));
    const body = h("div");
    view.appendChild(body);
    const draw = async () => {
      const data = await api("queue", { lane, after, keys_after: keysAfter, limit: 50 });
      if (!live()) return;
      const c = data.counts;
      const max = data.count_max;
      const laneLink = (name, label) =>
        h("a", { class: "tab" + (lane === name ? " on" : ""), href: route("queue", { lane: name }), data: { lane: name } }, label);
      const runRow = (r) =>
        h(
          "tr",
          { class: "queued", data: { run: r.run_id } },
          h("td", null, runLink(r.run_id)),
          h("td", null, r.workflow_name),
          h("td", { class: "n" + (r.priority > 0 ? " hot" : "") }, num(r.priority)),
          h("td", null, h("span", { title: r.due_at }, r.due_in_ms > 0 ? relative(r.due_in_ms) : "due, " + relative(r.due_in_ms))),
          h("td", null, r.concurrency_key === null ? dash(null) : h("span", { class: "id" }, r.concurrency_key))
        );
      const keyRow = (k) =>
        h(
          "tr",
          { class: "key", data: { key: k.key } },
          h("td", null, h("span", { class: "id" }, k.key)),
          h("td", { class: "n" }, num(k.limit)),
          h("td", { class: "n" + (k.live >= k.limit ? " hot" : "") }, num(k.live)),
          h("td", { class: "n" }, atLeast(k.queued, max)),
          h("td", null, k.limit === 0 ? pill("held") : k.live >= k.limit ? pill("full") : pill("room"))
        );
      const fresh = h(
        "div",
        null,
        h(
          "div",
          { class: "cards" },
          card("due now", atLeast(c.due, max), { note: "claimable, no key limit", data: { k: "due" } }),
          card("due, keyed", atLeast(c.keyed, max), { note: "claimed while their key has room", data: { k: "keyed" } }),
          card("not yet due", atLeast(c.later, max), { data: { k: "later" } }),
          card("paused workflows", num(data.paused.length), { warn: data.paused.length > 0, data: { k: "paused" } })
        ),
        section(
          "Runs",
          h("div", { class: "tabs" }, laneLink("due", "Due now, by priority"), laneLink("later", "Not yet due, soonest first")),
          table(["Run", "Workflow", "Priority", "Due", "Key"], data.runs.map(runRow), {
            class: "queue-runs",
            empty: lane === "due" ? "No run is due." : "No run waits for its time.",
          }),
          h(
            "div",
            { class: "pager" },
            after ? h("a", { class: "button", href: route("queue", { lane }) }, "« First page") : null,
            data.next ? h("a", { class: "button", href: route("queue", { lane, after: data.next }), rel: "next" }, "Next page ›") : null
          )
        ),
        section(
          "Keys with limits",
          table(["Key", "Limit", "Live", "Queued", ""], data.keys.map(keyRow), { class: "queue-keys", empty: "No key has a limit." }),
          data.keys_next || keysAfter
            ? h(
                "div",
                { class: "pager" },
                keysAfter ? h("a", { class: "button", href: route("queue", { lane }) }, "« First keys") : null,
                data.keys_next ? h("a", { class: "button", href: route("queue", { lane, keys_after: data.keys_next }) }, "Next keys ›") : null
              )
            : null
        ),
        section(
          "Paused workflows",
          table(
            ["Workflow", "Paused", "Queued runs held"],
            data.paused.map((p) =>
              h("tr", { class: "paused", data: { workflow: p.workflow_name } }, h("td", null, p.workflow_name), h("td", null, ago(p.paused_at)), h("td", { class: "n" }, atLeast(p.queued, max)))
            ),
            { class: "queue-paused", empty: "No workflow is paused." }
          )
        )
      );
      clear(body);
      body.appendChild(fresh);
    };
    await draw();
    const timer = setInterval(() => draw().catch((e) => live() && showError(e.message)), 5000);
    teardown.push(() => clearInterval(timer));
  };

  // ---------------------------------------------------------------- retries

  pages.retries = async function (view, params, live) {
    const kind = params.get("kind") === "exhausted" ? "exhausted" : "due";
    const run = params.get("run") || "";
    const after = params.get("after") || "";
    view.appendChild(
      h(
        "div",
        { class: "head" },
        h("h1", null, "Retries", run ? [h("span", { class: "crumb" }, " of "), runLink(run)] : null),
        h("div", { class: "sub muted" }, "Refreshes every 5 s. Failed units whose retry time has come, and units out of attempts (dead letters). Read-only: ", h("code", null, "fencepost retry"), " and ", h("code", null, "fencepost cancel-units"), " move them.")
      )
    );
    const body = h("div");
    view.appendChild(body);
    const base = run ? { run } : {};
    const draw = async () => {
      const data = await api("retries", { kind, run, after, limit: 50 });
      if (!live()) return;
      const tab = (name, label) =>
        h("a", { class: "tab" + (kind === name ? " on" : ""), href: route("retries", { ...base, kind: name }), data: { kind: name } }, label);
      const row = (u) =>
        h(
          "tr",
          { class: "retry-unit", data: { run: u.run_id, unit: u.unit_id } },
          h("td", null, runLink(u.run_id)),
          h("td", null, unitLink(u.run_id, u.unit_id)),
          h("td", null, u.step_id === null ? dash(null) : h("span", { class: "id" }, u.step_id)),
          h("td", null, pill(u.status)),
          h("td", { class: "n" }, num(u.attempts)),
          h("td", null, u.retry_at === null ? dash(null) : h("span", { title: u.retry_at }, "due, " + relative(u.due_in_ms))),
          h("td", { class: "reason" }, dash(u.failure_reason))
        );
      const fresh = section(
        run ? "Units of this run" : "Units of every run",
        h("div", { class: "tabs" }, tab("due", "Due for a retry, soonest first"), tab("exhausted", "Exhausted, by run")),
        table(["Run", "Unit", "Step", "Status", "Attempts", "Retry", "Last failure"], data.units.map(row), {
          class: "retry-units",
          empty: kind === "due" ? "No failed unit is due for a retry." : "No unit is exhausted.",
        }),
        h(
          "div",
          { class: "pager" },
          run ? h("a", { class: "button", href: route("retries", { kind }) }, "All runs") : null,
          after ? h("a", { class: "button", href: route("retries", { ...base, kind }) }, "« First page") : null,
          data.next ? h("a", { class: "button", href: route("retries", { ...base, kind, after: data.next }), rel: "next" }, "Next page ›") : null
        )
      );
      clear(body);
      body.appendChild(fresh);
    };
    await draw();
    const timer = setInterval(() => draw().catch((e) => live() && showError(e.message)), 5000);
    teardown.push(() => clearInterval(timer));
  };

  // ---------------------------------------------------------------- schedules

  pages.schedules = async function (view, params, live) {
    view.appendChild(
      h(
        "div",
        { class: "head" },
        h("h1", null, "Schedules"),
        h("div", { class: "sub muted" }, "Refreshes every 5 s. The cron schedules, when each fires next and the run its last fire queued. Read-only: ", h("code", null, "fencepost schedules"), " pauses and resumes them; ", h("code", null, "fencepost tick"), " fires their due slots.")
      )
    );
    const body = h("div");
    view.appendChild(body);
    const draw = async () => {
      const data = await api("schedules");
      if (!live()) return;
      // Times relative to the server's clock, as next_in_ms is.
      const nowMs = new Date(data.now).getTime();
      const next = (s) => {
        if (s.paused) return h("span", { title: s.next_slot ? "next slot " + s.next_slot + ", not fired while paused" : null }, pill("paused"));
        if (s.next_slot === null) return h("span", { class: "muted" }, "no slot left");
        // A slot gone by means no tick has run since: say so rather than "ago".
        return h("time", { datetime: s.next_slot, title: s.next_slot }, s.next_in_ms > 0 ? relative(s.next_in_ms) : "due, " + relative(s.next_in_ms));
      };
      const last = (s) => {
        if (s.last_run_id === null) return h("span", { class: "muted" }, s.last_slot === null ? "never fired" : "–");
        return [
          s.last_run_status === null
            ? [h("span", { class: "id", title: s.last_run_id }, s.last_run_id), " ", h("span", { class: "muted" }, "(no longer in the ledger)")]
            : [runLink(s.last_run_id), " ", pill(s.last_run_status)],
          // The newest slot may be newer than the run's: a skipped slot (overlap skip) queues none.
          s.last_slot ? h("div", { class: "step-meta" }, "last slot ", ago(s.last_slot, nowMs)) : null,
        ];
      };
      const row = (s) =>
        h(
          "tr",
          { class: "schedule", data: { name: s.name } },
          h("td", { class: "nowrap" }, h("span", { class: "id" }, s.name)),
          h("td", { class: "nowrap" }, h("code", null, s.cron), " ", h("span", { class: "muted" }, s.timezone)),
          h("td", null, s.workflow_name),
          h(
            "td",
            { class: "nowrap", title: s.overlap === "skip" ? "a slot is skipped while the last fired run has not ended" : "fires even while the last fired run has not ended" },
            s.overlap,
            ", catch-up " + s.catch_up
          ),
          h("td", { class: "nowrap" }, next(s)),
          h("td", { class: "nowrap" }, last(s))
        );
      const fresh = h(
        "div",
        null,
        h(
          "section",
          { class: "panel flush" },
          table(["Name", "Cron", "Workflow", "Overlap / catch-up", "Next fire", "Last run"], data.schedules.map(row), {
            class: "schedules",
            empty: ["No schedules. ", h("code", null, "put_schedule"), " creates one; ", h("code", null, "fencepost tick"), " fires them."],
          })
        ),
        data.more ? h("p", { class: "muted", id: "schedules-more" }, "The first " + data.schedules.length + " of " + num(data.total) + ", by name.") : null
      );
      clear(body);
      body.appendChild(fresh);
    };
    await draw();
    const timer = setInterval(() => draw().catch((e) => live() && showError(e.message)), 5000);
    teardown.push(() => clearInterval(timer));
  };

  // ---------------------------------------------------------------- live tail

  const TAIL_PAGE = 200;
  const TAIL_POLL_MS = 1000;
  const TAIL_RETRY_MS = 3000;

  pages.tail = async function (view, params, live) {
    const runId = params.get("run") || "";
    const status = h("span", { class: "conn", id: "conn" }, "connecting…");
    const runIn = h("input", { placeholder: "only this run id", value: runId, "aria-label": "run id" });
    const pause = h("button", { type: "button" }, "Pause");
    let paused = false;
    const held = [];
    pause.addEventListener("click", () => {
      paused = !paused;
      pause.textContent = paused ? "Resume" : "Pause";
      if (!paused) held.splice(0).forEach((e) => push(e, true));
    });
    view.appendChild(
      h(
        "div",
        { class: "head" },
        h("h1", null, "Live tail"),
        h(
          "form",
          { class: "filters", onsubmit: (e) => { e.preventDefault(); go("tail", { run: runIn.value.trim() }); } },
          runIn,
          h("button", { type: "submit" }, "Follow"),
          runId ? h("a", { class: "reset", href: route("tail") }, "every run") : null,
          pause,
          status
        )
      )
    );
    const rows = h("tbody", { id: "events" });
    const box = h(
      "div",
      { class: "table-wrap scroll", id: "tail-box" },
      h("table", { class: "events" }, h("thead", null, h("tr", null, ["Seq", "Time", "Run", "Type", "Actor", "Gen", "Payload"].map((x) => h("th", null, x)))), rows)
    );
    view.appendChild(h("section", { class: "panel flush" }, box));
    const counter = h("p", { class: "muted" });
    view.appendChild(counter);
    let shown = 0;

    function push(e, isNew) {
      if (paused) {
        // Only what would be shown is kept: the table keeps the newest 500 rows anyway.
        held.push(e);
        if (held.length > 500) held.splice(0, held.length - 500);
        return;
      }
      const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
      const kind = e.type.split(".")[0];
      const row = h(
          "tr",
          { class: "event" + (isNew ? " fresh" : ""), data: { seq: e.seq, type: e.type } },
          h("td", { class: "n" }, e.seq),
          h("td", { class: "nowrap" }, h("time", { datetime: e.ts, title: e.ts }, clock(e.ts, true))),
          h("td", { class: "nowrap" }, runLink(e.run_id)),
          h("td", null, h("span", { class: "etype t-" + kind.replace(/[^a-z]/g, "") }, e.type), e.taken_from ? [" ", h("span", { class: "flag", title: "a takeover: the previous owner's lease had expired" }, "taken from " + e.taken_from)] : null),
          h("td", { class: "nowrap" }, e.actor_type ? e.actor_type + ":" + (e.actor_id || "") : dash(null)),
          h("td", { class: "n" }, dash(e.generation)),
          h("td", { class: "result", title: e.payload }, e.payload)
        );
      rows.appendChild(row);
      while (rows.childElementCount > 500) rows.removeChild(rows.firstChild);
      shown += 1;
      counter.textContent = shown + " events received" + (runId ? " for this run" : "") + "; the newest 500 are kept.";
      if (atBottom) box.scrollTop = box.scrollHeight;
      if (isNew) setTimeout(() => row.classList.remove("fresh"), 2000);
    }

    const backlog = await api("events", { run: runId, limit: 50 });
    if (!live()) return;
    backlog.events.forEach((e) => push(e, false));
    box.scrollTop = box.scrollHeight;
    // Polled, not streamed: one short request a second, so between polls the page has no
    // request open and a headless browser's screenshot or a crawler's load finishes (an open
    // EventSource never lets the network go idle). A full page is followed at once, so a
    // burst is read through without waiting. /api/stream stays for clients that want a stream.
    let after = backlog.after;
    let timer = null;
    const poll = async () => {
      timer = null;
      let page;
      try {
        page = await api("events", { run: runId, after: String(after), limit: TAIL_PAGE });
      } catch (err) {
        if (!live()) return;
        status.textContent = "reconnecting…";
        status.className = "conn off";
        timer = setTimeout(poll, TAIL_RETRY_MS);
        return;
      }
      if (!live()) return;
      status.textContent = "live";
      status.className = "conn on";
      page.events.forEach((e) => push(e, true));
      after = page.after;
      timer = setTimeout(poll, page.events.length >= TAIL_PAGE ? 0 : TAIL_POLL_MS);
    };
    await poll();
    teardown.push(() => timer !== null && clearTimeout(timer));
  };

  // ---------------------------------------------------------------- throughput

  pages.throughput = async function (view, params, live) {
    view.appendChild(h("div", { class: "head" }, h("h1", null, "Throughput"), h("div", { class: "sub muted" }, "Events committed per minute over the last hour. Refreshes every 30 s.")));
    const body = h("div");
    view.appendChild(body);
    const draw = async () => {
      const data = await api("throughput", { minutes: 60 });
      if (!live()) return;
      const counts = data.minutes.map((m) => m.count);
      const peak = Math.max(0, ...counts);
      // The window: its full minutes and the part of the current one gone by.
      const into = (new Date(data.now).getTime() - new Date(data.minutes[counts.length - 1].start).getTime()) / 1000;
      const avg = data.total / ((counts.length - 1) * 60 + Math.max(into, 1));
      const fresh = h(
        "div",
        null,
        h(
          "div",
          { class: "cards" },
          card("events in the last hour", num(data.total), { data: { k: "total" } }),
          card("busiest minute", num(peak)),
          card("events per second", avg >= 10 ? num(Math.round(avg)) : avg.toFixed(2), { note: "average over the hour" }),
          card("newest seq", num(data.head))
        ),
        section("Events per minute", chart(data.minutes, peak), h("p", { class: "muted" }, data.exact ? "Counted exactly." : "Counted from seq positions: seq is a dense global cursor, so a minute's count is the seq distance between its first event and the next minute's, each found by a few index probes (gaps in seq, and a precision of 0.2% of an average minute, make it approximate)."))
      );
      clear(body);
      body.appendChild(fresh);
    };
    await draw();
    const timer = setInterval(() => draw().catch((e) => live() && showError(e.message)), 30000);
    teardown.push(() => clearInterval(timer));
  };

  function niceMax(n) {
    if (n <= 5) return 5;
    const p = Math.pow(10, Math.floor(Math.log10(n)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= n) return m * p;
    return 10 * p;
  }

  function chart(minutes, peak) {
    const W = 1100;
    const H = 300;
    const left = 64;
    const bottom = 28;
    const top = 12;
    const plotW = W - left - 12;
    const plotH = H - bottom - top;
    const max = niceMax(peak);
    const g = svg("svg", { viewBox: "0 0 " + W + " " + H, class: "chart", role: "img", "aria-label": "events per minute" });
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4;
      const y = top + plotH - (plotH * i) / 4;
      g.appendChild(svg("line", { x1: left, x2: W - 12, y1: y, y2: y, class: i ? "grid" : "axis" }));
      const label = svg("text", { x: left - 8, y: y + 4, class: "tick", "text-anchor": "end" });
      label.textContent = num(v);
      g.appendChild(label);
    }
    const step = plotW / minutes.length;
    minutes.forEach((m, i) => {
      const bh = max ? (plotH * m.count) / max : 0;
      const x = left + i * step + 1;
      const rect = svg("rect", { x, y: top + plotH - bh, width: Math.max(1, step - 2), height: Math.max(bh, m.count ? 1 : 0), class: i === minutes.length - 1 ? "bar now" : "bar", "data-count": m.count, "data-start": m.start });
      const tip = svg("title");
      tip.textContent = new Date(m.start).toLocaleTimeString() + ": " + num(m.count) + " events" + (i === minutes.length - 1 ? " (this minute so far)" : "");
      rect.appendChild(tip);
      g.appendChild(rect);
      const ago = minutes.length - 1 - i;
      if (ago % 10 === 0) {
        const t = svg("text", { x: x + step / 2, y: H - 8, class: "tick", "text-anchor": "middle" });
        t.textContent = ago ? "-" + ago + " min" : "now";
        g.appendChild(t);
      }
    });
    return h("div", { class: "chart-wrap" }, g);
  }

  // ---------------------------------------------------------------- doctor

  pages.doctor = async function (view, params, live) {
    const checks = params.get("checks") === "1";
    view.appendChild(h("div", { class: "head" }, h("h1", null, "Doctor"), h("div", { class: "sub muted" }, "What ", h("code", null, "fencepost doctor"), " reports.")));
    const data = await api("doctor", { checks: checks ? "1" : "" });
    if (!live()) return;
    const p = data.pragmas;
    const verdict = data.healthy === null ? null : data.healthy ? h("span", { class: "pill s-completed", id: "verdict" }, "healthy") : h("span", { class: "pill s-failed", id: "verdict" }, "NOT healthy");
    view.appendChild(
      h(
        "div",
        { class: "grid2" },
        section(
          "Database",
          kv([
            ["database", h("span", { class: "id" }, data.database)],
            ["schema", data.schema_version + " (library " + data.library_schema_version + ")"],
            ["journal_mode", p.journal_mode],
            ["synchronous", String(p.synchronous)],
            ["busy_timeout", p.busy_timeout + " ms"],
            ["foreign_keys", p.foreign_keys ? "on" : "off"],
            // As `fencepost doctor`: TLS is PostgreSQL's alone.
            ...(p.tls === null || p.tls === undefined ? [] : [["tls", String(p.tls)]]),
          ])
        ),
        section(
          "Checks",
          data.checked
            ? [
                kv([
                  ["verdict", verdict],
                  ["integrity", (data.integrity_check || []).join("; ") + " (" + data.integrity_check_mode + " check)"],
                  ["orphan attempts", num(data.orphan_attempts.length)],
                  ["expired leases on active runs", num(data.expired_leases_total)],
                ]),
                data.orphan_attempts.length
                  ? table(["Run", "Unit", "Attempt", "Dispatch id"], data.orphan_attempts.map((o) => h("tr", null, h("td", null, runLink(o.run_id)), h("td", { class: "id" }, o.unit_id), h("td", { class: "n" }, o.attempt), h("td", { class: "id" }, o.dispatch_id))), {})
                  : null,
              ]
            : [
                kv([["expired leases on active runs", num(data.expired_leases_total)]]),
                h("p", { class: "muted" }, "The integrity check and the orphan-attempt scan read the whole database: seconds on a large ledger, so they run when asked."),
                h("a", { class: "button primary", id: "run-checks", href: route("doctor", { checks: "1" }) }, "Run the checks"),
              ]
        )
      )
    );
    view.appendChild(
      section(
        "Expired leases on active runs",
        table(
          ["Run", "Owner", "Gen", "Expired"],
          data.expired_leases_on_active_runs.map((le) => h("tr", null, h("td", null, runLink(le.run_id)), h("td", { class: "id" }, dash(le.owner_id)), h("td", { class: "n" }, le.generation), h("td", null, ago(le.expires_at)))),
          { empty: "None: every active run's owner is on time." }
        )
      )
    );
  };

  // ---------------------------------------------------------------- start

  async function start() {
    try {
      meta = await api("meta");
    } catch (e) {
      clear(main);
      showError(e.message);
      return;
    }
    document.getElementById("db").textContent = meta.database + " · fencepost " + meta.version;
    window.addEventListener("hashchange", render);
    render();
  }

  start();
})();
