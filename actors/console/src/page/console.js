// The toolmesh approvals console. Plain script, no dependencies.
//
// The token stays in this tab's sessionStorage and goes with every API request as
// `Authorization: Bearer`; the server keeps no session. Data from approvals is only ever
// written with textContent (never innerHTML), so nothing in it becomes markup.
"use strict";

(function () {
  const TOKEN_KEY = "toolmesh-console-token";
  const ACCOUNTS_KEY = "toolmesh-console-accounts";
  const RECONNECT_MS = 2000;

  const $ = (id) => document.getElementById(id);
  const pending = new Map(); // id -> <li>
  const history = new Map(); // id -> <li>
  let streamAbort = null;
  let grant = null;

  // <tag attrs…>children</tag>; strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  async function api(path, options) {
    const opts = Object.assign({ headers: {} }, options || {});
    opts.headers = Object.assign({ Authorization: "Bearer " + token() }, opts.headers);
    let response;
    try {
      response = await fetch(path, opts);
    } catch (e) {
      return { status: 0, body: { ok: false, error: "unavailable", error_message: "the console node does not answer: " + e.message } };
    }
    let body;
    try {
      body = await response.json();
    } catch (e) {
      body = { ok: false, error: "internal", error_message: "the reply is not JSON (HTTP " + response.status + ")" };
    }
    return { status: response.status, body: body };
  }

  function describeError(body) {
    return (body.error || "error") + ": " + (body.error_message || "no message");
  }

  // ---- sign in / out ----

  async function signIn(event) {
    if (event) event.preventDefault();
    const typed = $("token").value.trim();
    if (typed) sessionStorage.setItem(TOKEN_KEY, typed);
    if (!token()) return;
    $("sign-in-error").textContent = "";
    const me = await api("/api/me");
    if (me.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      $("sign-in-error").textContent = "This token is not known to the console.";
      $("token").focus();
      return;
    }
    if (!me.body.ok) {
      $("sign-in-error").textContent = describeError(me.body);
      return;
    }
    grant = me.body;
    $("token").value = "";
    $("sign-in").hidden = true;
    $("whoami").hidden = false;
    $("console").hidden = false;
    $("approver").textContent = grant.approver;
    $("accounts").textContent = grant.accounts === "*" ? "every account" : "accounts " + grant.accounts.join(", ");
    $("accounts-form").hidden = grant.accounts !== "*";
    $("list-accounts").value = sessionStorage.getItem(ACCOUNTS_KEY) || "";
    $("pending-title").setAttribute("tabindex", "-1");
    $("pending-title").focus();
    connect();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (streamAbort) streamAbort.abort();
    streamAbort = null;
    grant = null;
    pending.clear();
    history.clear();
    $("pending").replaceChildren();
    $("history").replaceChildren();
    refreshCounts();
    $("console").hidden = true;
    $("whoami").hidden = true;
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = typeof message === "string" ? message : "";
    $("token").focus();
  }

  // ---- the live stream (Server-Sent Events read with fetch, so the token goes as a header) ----

  async function connect() {
    if (streamAbort) streamAbort.abort();
    const abort = new AbortController();
    streamAbort = abort;
    const accounts = grant && grant.accounts === "*" ? $("list-accounts").value.trim() : "";
    const url = "/api/stream" + (accounts ? "?accounts=" + encodeURIComponent(accounts) : "");
    $("connection").textContent = "Connecting…";
    try {
      const response = await fetch(url, { headers: { Authorization: "Bearer " + token() }, signal: abort.signal });
      if (response.status === 401) {
        signOut("The console no longer knows this token; sign in again.");
        return;
      }
      if (!response.ok) {
        let body = {};
        try { body = await response.json(); } catch (e) { /* not JSON */ }
        $("stream-error").textContent = describeError(body);
        if (response.status === 403 || response.status === 400) return;
        throw new Error("HTTP " + response.status);
      }
      $("stream-error").textContent = "";
      $("connection").textContent = "Live: new approvals appear here as they are requested.";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
          dispatch(block);
        }
      }
    } catch (e) {
      if (abort.signal.aborted) return;
    }
    if (streamAbort !== abort) return;
    $("connection").textContent = "Disconnected; reconnecting…";
    setTimeout(() => { if (streamAbort === abort && grant) connect(); }, RECONNECT_MS);
  }

  function dispatch(block) {
    let name = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    let payload;
    try { payload = JSON.parse(data.join("\n")); } catch (e) { return; }
    if (name === "snapshot") onSnapshot(payload);
    else if (name === "requested") onRequested(payload, true);
    else if (name === "decided") onDecided(payload.approval);
    else if (name === "failure") $("stream-error").textContent = describeError(payload);
  }

  function onSnapshot(snapshot) {
    const seen = new Set();
    for (const item of snapshot.approvals || []) {
      seen.add(item.approval.id);
      onRequested(item, false);
    }
    for (const [id, li] of pending) {
      if (!seen.has(id)) { li.remove(); pending.delete(id); }
    }
    const errors = (snapshot.errors || []).map((e) => e.account + ": " + describeError(e));
    $("stream-error").textContent = errors.join("; ");
    refreshCounts();
  }

  function onRequested(item, live) {
    const approval = item.approval;
    if (!approval || approval.status !== "pending" || history.has(approval.id)) return;
    const old = pending.get(approval.id);
    const li = renderPending(item);
    if (old) old.replaceWith(li);
    else $("pending").append(li);
    pending.set(approval.id, li);
    if (live && !old) {
      li.classList.add("new");
      $("announce").textContent = "New approval: " + approval.tool_name + " in " + approval.account + ", risk " + approval.risk_level + ".";
    }
    refreshCounts();
  }

  function onDecided(approval) {
    if (!approval || !approval.id) return;
    if (approval.status === "pending") return;
    const li = pending.get(approval.id);
    if (li) {
      const hadFocus = li.contains(document.activeElement);
      li.remove();
      pending.delete(approval.id);
      if (hadFocus) focusNext();
    }
    const entry = renderHistory(approval);
    const old = history.get(approval.id);
    if (old) old.replaceWith(entry);
    else $("history").prepend(entry);
    history.set(approval.id, entry);
    refreshCounts();
  }

  function focusNext() {
    const next = $("pending").querySelector("li h3");
    (next || $("pending-title")).focus();
  }

  function refreshCounts() {
    $("pending-count").textContent = "(" + pending.size + ")";
    $("no-pending").hidden = pending.size > 0;
    $("no-history").hidden = history.size > 0;
  }

  // ---- rendering: textContent only ----

  function field(name, value, cls) {
    return [el("dt", {}, name), el("dd", { class: cls }, value === null || value === undefined || value === "" ? "—" : value)];
  }

  function diffView(diff) {
    const pre = el("pre", { class: "diff", "aria-label": "diff of the edit" });
    for (const line of diff.split("\n")) {
      const cls = line.startsWith("+++") || line.startsWith("---") ? "file"
        : line.startsWith("@@") ? "hunk"
        : line.startsWith("+") ? "add"
        : line.startsWith("-") ? "del" : null;
      pre.append(el("span", { class: cls }, line), "\n");
    }
    return pre;
  }

  function renderPending(item) {
    const a = item.approval;
    const key = a.id.replace(/[^A-Za-z0-9_-]/g, "_");
    const headingId = "h-" + key;
    const reasonId = "reason-" + key;
    const error = el("p", { class: "error", role: "alert" });
    const reason = el("textarea", { id: reasonId, rows: 2, maxlength: 2000 });
    const li = el("li", { "data-approval-id": a.id, "aria-labelledby": headingId });
    const decide = async (approved, button) => {
      const buttons = li.querySelectorAll("button");
      buttons.forEach((b) => { b.disabled = true; });
      error.textContent = "";
      const r = await api("/api/approvals/" + encodeURIComponent(a.account) + "/" + encodeURIComponent(a.id) + "/decide", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ approved: approved, reason: reason.value }),
      });
      if (r.body.ok) {
        onDecided(r.body.approval);
        return;
      }
      if (r.status === 401) { signOut("The console no longer knows this token; sign in again."); return; }
      error.textContent = describeError(r.body);
      buttons.forEach((b) => { b.disabled = false; });
      button.focus();
    };
    const approve = el("button", { type: "button", class: "approve" }, "Approve");
    const reject = el("button", { type: "button", class: "reject" }, "Reject");
    const dismiss = el("button", { type: "button", class: "dismiss" }, "Dismiss");
    approve.addEventListener("click", () => decide(true, approve));
    reject.addEventListener("click", () => decide(false, reject));
    dismiss.addEventListener("click", () => {
      li.remove();
      pending.delete(a.id);
      refreshCounts();
      focusNext();
    });
    const args = item.arguments !== null && item.arguments !== undefined
      ? JSON.stringify(item.arguments, null, 2)
      : a.arguments_preview + (item.arguments_truncated ? "\n(the full arguments are too large to show; this is the preview)" : "");
    // Parts a pending approval may lack are null: append() would print them as "null".
    li.append(...[
      el("h3", { id: headingId, tabindex: "-1" }, a.tool_name + " ", el("span", { class: "risk-" + a.risk_level }, "(" + a.risk_level + " risk)")),
      el("dl", {},
        ...field("Account", a.account),
        ...field("Session", a.session_id),
        ...field("User", item.user_id),
        ...field("Agent", item.agent_id),
        ...field("Side effects", (a.side_effects || []).join(", ")),
        ...field("Requested", a.created_at),
        ...field("Expires", a.expires_at),
        ...field("Approval", a.id),
        ...field("Invocation", a.invocation_id)),
      el("h4", {}, "Arguments"),
      el("pre", { class: "arguments", "aria-label": "arguments" }, args),
      item.diff ? el("h4", {}, "Change it would make") : null,
      item.diff ? diffView(item.diff) : null,
      item.detail_error ? el("p", { class: "error" }, "Details unavailable: " + item.detail_error) : null,
      el("label", { for: reasonId }, "Reason"),
      reason,
      el("div", {}, approve, reject, dismiss),
      error,
    ].filter((part) => part !== null));
    return li;
  }

  function renderHistory(a) {
    return el("li", { "data-approval-id": a.id, class: "decided" },
      el("h3", {}, a.tool_name + " — ", el("span", { class: "status" }, a.status)),
      el("dl", {},
        ...field("Account", a.account),
        ...field("Session", a.session_id),
        ...field("Decided by", a.decided_by, "decided-by"),
        ...field("Decided at", a.decided_at, "decided-at"),
        ...field("Reason", a.reason, "reason"),
        ...field("Approval", a.id)));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => signOut());
    $("accounts-form").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem(ACCOUNTS_KEY, $("list-accounts").value.trim());
      connect();
    });
    refreshCounts();
    if (token()) signIn();
    else $("token").focus();
  });
})();
