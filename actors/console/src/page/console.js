// The toolmesh approvals console. Plain script, no dependencies.
//
// The token stays in this tab's sessionStorage and goes with every API request as
// `Authorization: Bearer`; the server keeps no session. Data from approvals is only ever
// written with textContent (never innerHTML), so nothing in it becomes markup.
//
// An approval routed to reviewers (`reviewers: "<group>"`) is "mine" when /api/me lists that
// group among the approver's, and "others'" otherwise: shown read-only, only a member decides
// it (the approval actor enforces this whatever the page shows). One without reviewers is
// anyone's who may decide in its account. "Only approvals routed to my reviewer groups" hides
// all but mine.
"use strict";

(function () {
  const TOKEN_KEY = "toolmesh-console-token";
  const ACCOUNTS_KEY = "toolmesh-console-accounts";
  const RECONNECT_MS = 2000;

  const $ = (id) => document.getElementById(id);
  const pending = new Map(); // id -> <li>
  const history = new Map(); // id -> <li>
  // id -> the edited arguments' text, kept while the entry is re-rendered (a reconnect's
  // snapshot, an escalation, a member's counted approval) so an edit is never lost.
  const drafts = new Map();
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
    const groups = grant.groups || [];
    $("groups").textContent = groups.length ? "(reviewer in " + groups.join(", ") + ")" : "";
    $("accounts").textContent = grant.accounts === "*" ? "every account" : "accounts " + grant.accounts.join(", ");
    $("accounts-form").hidden = grant.accounts !== "*";
    $("list-accounts").value = sessionStorage.getItem(ACCOUNTS_KEY) || "";
    $("pending-title").setAttribute("tabindex", "-1");
    $("pending-title").focus();
    connect();
    loadGrants();
  }

  function signOut(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (streamAbort) streamAbort.abort();
    streamAbort = null;
    grant = null;
    pending.clear();
    history.clear();
    drafts.clear();
    $("pending").replaceChildren();
    $("history").replaceChildren();
    $("grants").replaceChildren();
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
    drafts.delete(approval.id);
    const entry = renderHistory(approval);
    const old = history.get(approval.id);
    if (old) old.replaceWith(entry);
    else $("history").prepend(entry);
    history.set(approval.id, entry);
    refreshCounts();
  }

  function focusNext() {
    const onlyMine = $("for-me-only").checked;
    const next = $("pending").querySelector(onlyMine ? "li[data-route=mine] h3" : "li h3");
    (next || $("pending-title")).focus();
  }

  function refreshCounts() {
    const mine = $("pending").querySelectorAll("li[data-route=mine]").length;
    const onlyMine = $("for-me-only").checked;
    $("pending-count").textContent = "(" + pending.size + ")";
    $("for-me-count").textContent = "(" + mine + ")";
    $("pending").classList.toggle("for-me-only", onlyMine);
    $("no-pending").hidden = pending.size > 0;
    $("no-mine").hidden = !onlyMine || mine > 0 || pending.size === 0;
    $("no-history").hidden = history.size > 0;
  }

  // "mine" (routed to one of my groups), "others" (routed to a group I am not in) or
  // "anyone" (not routed).
  function routeOf(a) {
    if (!a.reviewers) return "anyone";
    return grant && (grant.groups || []).includes(a.reviewers) ? "mine" : "others";
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

  function decisionsText(a) {
    if (!a.decisions || !a.decisions.length) return null;
    return a.decisions.map((d) => d.approver + " " + (d.approved ? "approved" : "rejected") + " at " + d.at
      + (d.reason ? " (" + d.reason + ")" : "")).join("; ");
  }

  function routeFields(a) {
    if (!a.reviewers) return field("Reviewers", "anyone who may decide in " + a.account, "reviewers");
    const approvals = (a.decisions || []).filter((d) => d.approved).length;
    return [
      ...field("Reviewers", a.reviewers + (a.escalated ? " (escalated)" : ""), "reviewers"),
      ...field("Quorum", approvals + " of " + a.quorum + " approvals", "quorum"),
      ...field("Decisions", decisionsText(a), "decisions"),
    ];
  }

  function routeNote(a, route) {
    if (route === "mine") return el("p", { class: "route route-mine" }, "For you: routed to your reviewer group " + a.reviewers + ".");
    if (route === "others") {
      const why = grant && !grant.reviewer
        ? " Your approver name cannot decide routed approvals (only [A-Za-z0-9_-] names can)."
        : "";
      return el("p", { class: "route route-others" }, "Not yours: routed to the reviewers " + a.reviewers + "; only its members decide it." + why);
    }
    return null;
  }

  // Optional positive whole number from an input; undefined when empty, null when bad.
  function wholeNumber(input) {
    const text = input.value.trim();
    if (!text) return undefined;
    return /^[1-9][0-9]*$/.test(text) ? Number(text) : null;
  }

  function renderPending(item) {
    const a = item.approval;
    const route = routeOf(a);
    const key = a.id.replace(/[^A-Za-z0-9_-]/g, "_");
    const headingId = "h-" + key;
    const reasonId = "reason-" + key;
    const error = el("p", { class: "error decide-error", role: "alert" });
    const note = el("p", { class: "status decide-note", role: "status" });
    const reason = el("textarea", { id: reasonId, class: "reason", rows: 2, maxlength: 2000 });
    const li = el("li", { "data-approval-id": a.id, "data-route": route, "aria-labelledby": headingId, class: "route-" + route });

    // Edit arguments in place: an editor opened on demand, prefilled with the full arguments.
    // Not for others' approvals, nor arguments too large to show, nor a quorum above one (each
    // member approves the arguments they saw).
    const editable = route !== "others" && item.arguments !== null && typeof item.arguments === "object"
      && !Array.isArray(item.arguments) && !item.arguments_truncated && (a.quorum || 1) <= 1;
    const editId = "edit-" + key;
    const editError = el("p", { class: "error edit-error", role: "alert" });
    let editor = null;
    const editBox = el("div", { class: "editor", hidden: true });
    const openEditor = (text) => {
      if (!editor) {
        editor = el("textarea", { id: editId, class: "edit-arguments", rows: 10, spellcheck: "false" });
        editor.addEventListener("input", () => { drafts.set(a.id, editor.value); editError.textContent = ""; });
        const discard = el("button", { type: "button", class: "discard-edit" }, "Discard edit");
        discard.addEventListener("click", () => {
          drafts.delete(a.id);
          editor = null;
          editBox.replaceChildren();
          editBox.hidden = true;
          editButton.hidden = false;
          editButton.focus();
        });
        editBox.append(
          el("label", { for: editId }, "Edited arguments (a JSON object; Approve sends them in place of the call's, checked by a gateway first)"),
          editor, editError, discard);
      }
      editor.value = text;
      drafts.set(a.id, text);
      editBox.hidden = false;
      editButton.hidden = true;
    };
    const editButton = el("button", { type: "button", class: "edit-arguments" }, "Edit arguments");
    editButton.addEventListener("click", () => {
      openEditor(JSON.stringify(item.arguments, null, 2));
      editor.focus();
    });
    // The edited arguments to send: undefined for none (no editor, or unchanged), null when
    // the text is not a JSON object (the error is shown and nothing is sent).
    const editedArguments = () => {
      if (!editor) return undefined;
      let parsed;
      try {
        parsed = JSON.parse(editor.value);
      } catch (e) {
        editError.textContent = "The edited arguments are not JSON: " + e.message + ". Nothing was sent.";
        return null;
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        editError.textContent = "The edited arguments must be a JSON object ({…}). Nothing was sent.";
        return null;
      }
      return JSON.stringify(parsed) === JSON.stringify(item.arguments) ? undefined : parsed;
    };

    // Approve and remember: the grant asked for. Never offered where the approval actor would
    // refuse it anyway: a critical tool, a quorum above one.
    const grantable = route !== "others" && a.risk_level !== "critical" && (a.quorum || 1) <= 1;
    const grantError = el("p", { class: "error grant-error", role: "alert" });
    const scopeName = "scope-" + key;
    const scopeSession = el("input", { type: "radio", name: scopeName, id: scopeName + "-session", value: "session", checked: !!a.session_id, disabled: !a.session_id });
    const scopeAccount = el("input", { type: "radio", name: scopeName, id: scopeName + "-account", value: "account", checked: !a.session_id });
    const tools = el("input", { type: "text", id: "tools-" + key, class: "grant-tools", value: a.tool_name });
    const expiry = el("input", { type: "text", inputmode: "numeric", id: "expiry-" + key, class: "grant-expiry" });
    const uses = el("input", { type: "text", inputmode: "numeric", id: "uses-" + key, class: "grant-uses" });
    const grantAsk = () => {
      grantError.textContent = "";
      const ask = { scope: scopeSession.checked ? "session" : "account" };
      const globs = tools.value.split(",").map((t) => t.trim()).filter((t) => t);
      if (!globs.length) { grantError.textContent = "Name at least one tool (a glob) for the grant."; tools.focus(); return null; }
      ask.tools = globs;
      const seconds = wholeNumber(expiry);
      if (seconds === null) { grantError.textContent = "Expires in: a whole number of seconds, at least 1 (or empty)."; expiry.focus(); return null; }
      if (seconds !== undefined) ask.expires_in_s = seconds;
      const count = wholeNumber(uses);
      if (count === null) { grantError.textContent = "Uses: a whole number, at least 1 (or empty for no limit)."; uses.focus(); return null; }
      if (count !== undefined) ask.uses = count;
      return ask;
    };
    const rememberButton = el("button", { type: "button", class: "approve approve-remember" }, "Approve and remember");

    const decide = async (approved, button, remember) => {
      const buttons = li.querySelectorAll("button");
      error.textContent = "";
      note.textContent = "";
      editError.textContent = "";
      grantError.textContent = "";
      const body = { approved: approved, reason: reason.value };
      let edited;
      if (approved) {
        edited = editedArguments();
        if (edited === null) { editor.focus(); return; }
        if (edited !== undefined) body.arguments = edited;
      }
      if (remember) {
        const ask = grantAsk();
        if (ask === null) return;
        body.grant = ask;
      }
      buttons.forEach((b) => { b.disabled = true; });
      const r = await api("/api/approvals/" + encodeURIComponent(a.account) + "/" + encodeURIComponent(a.id) + "/decide", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      if (r.body.ok) {
        if (r.body.grant) loadGrants();
        if (r.body.approval && r.body.approval.status === "pending") {
          // A member's approval, counted towards the quorum: the entry stays, updated.
          const updated = Object.assign({}, item, { approval: r.body.approval });
          onRequested(updated, false);
          const again = pending.get(a.id);
          if (again) {
            again.querySelector(".decide-note").textContent = "Your approval counted; the approval waits for more reviewers.";
            const heading = again.querySelector("h3");
            if (heading) heading.focus();
          }
          return;
        }
        onDecided(r.body.approval);
        return;
      }
      if (r.status === 401) { signOut("The console no longer knows this token; sign in again."); return; }
      buttons.forEach((b) => { b.disabled = false; });
      const code = r.body.error;
      if (edited !== undefined && (code === "invalid_arguments" || code === "policy_denied")) {
        // In place, next to the edit, which stays as typed.
        editError.textContent = describeError(r.body);
        editor.focus();
      } else if (remember && /grant/.test(r.body.error_message || "")) {
        grantError.textContent = describeError(r.body);
        button.focus();
      } else {
        error.textContent = describeError(r.body);
        button.focus();
      }
    };
    const approve = el("button", { type: "button", class: "approve" }, "Approve");
    const reject = el("button", { type: "button", class: "reject" }, "Reject");
    const dismiss = el("button", { type: "button", class: "dismiss" }, "Dismiss");
    approve.addEventListener("click", () => decide(true, approve, false));
    reject.addEventListener("click", () => decide(false, reject, false));
    rememberButton.addEventListener("click", () => decide(true, rememberButton, true));
    dismiss.addEventListener("click", () => {
      li.remove();
      pending.delete(a.id);
      drafts.delete(a.id);
      refreshCounts();
      focusNext();
    });
    const args = item.arguments !== null && item.arguments !== undefined
      ? JSON.stringify(item.arguments, null, 2)
      : a.arguments_preview + (item.arguments_truncated ? "\n(the full arguments are too large to show; this is the preview)" : "");
    const remember = !grantable ? null : el("details", { class: "remember" },
      el("summary", {}, "Approve and remember…"),
      el("fieldset", {},
        el("legend", {}, "Remember this approval as a grant for later calls"),
        el("p", { class: "choice" }, scopeSession, el("label", { for: scopeSession.id }, "This session" + (a.session_id ? " (" + a.session_id + ")" : " (the call has none)"))),
        el("p", { class: "choice" }, scopeAccount, el("label", { for: scopeAccount.id }, "Every session of " + a.account)),
        el("label", { for: tools.id }, "Tools (comma-separated globs)"),
        tools,
        el("label", { for: expiry.id }, "Expires in (seconds; empty: the approval lifetime)"),
        expiry,
        el("label", { for: uses.id }, "Uses (empty: no limit)"),
        uses,
        el("div", {}, rememberButton),
        grantError));
    const actions = route === "others"
      ? el("div", {}, dismiss)
      : el("div", {}, approve, reject, dismiss);
    // Parts a pending approval may lack are null: append() would print them as "null".
    li.append(...[
      el("h3", { id: headingId, tabindex: "-1" }, a.tool_name + " ", el("span", { class: "risk-" + a.risk_level }, "(" + a.risk_level + " risk)")),
      routeNote(a, route),
      el("dl", {},
        ...field("Account", a.account),
        ...field("Session", a.session_id),
        ...field("User", item.user_id),
        ...field("Agent", item.agent_id),
        ...field("Side effects", (a.side_effects || []).join(", ")),
        ...routeFields(a),
        ...field("Requested", a.created_at),
        ...field("Expires", a.expires_at),
        ...field("Approval", a.id),
        ...field("Invocation", a.invocation_id)),
      el("h4", {}, "Arguments"),
      el("pre", { class: "arguments", "aria-label": "arguments" }, args),
      editable ? el("div", {}, editButton) : null,
      editable ? editBox : null,
      item.diff ? el("h4", {}, "Change it would make") : null,
      item.diff ? diffView(item.diff) : null,
      item.detail_error ? el("p", { class: "error" }, "Details unavailable: " + item.detail_error) : null,
      route === "others" ? null : el("label", { for: reasonId }, "Reason"),
      route === "others" ? null : reason,
      actions,
      note,
      error,
      remember,
    ].filter((part) => part !== null));
    if (drafts.has(a.id) && editable) openEditor(drafts.get(a.id));
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
        ...(a.reviewers ? field("Reviewers", a.reviewers, "reviewers") : []),
        ...(a.edited ? field("Edited", "yes: approved with arguments a reviewer changed", "edited") : []),
        ...field("Approval", a.id)));
  }

  // ---- grants: per account, listed on sign-in, after a decision that made one, on Refresh ----

  function grantAccounts() {
    if (!grant) return [];
    if (grant.accounts !== "*") return grant.accounts;
    return $("list-accounts").value.split(",").map((a) => a.trim()).filter((a) => a);
  }

  function grantState(g) {
    if (g.revoked_at) return "revoked at " + g.revoked_at;
    if (Date.parse(g.expires_at) <= Date.now()) return "expired";
    if (g.uses_left === 0) return "used up";
    return "active";
  }

  async function loadGrants() {
    const accounts = grantAccounts();
    $("grants-hint").hidden = accounts.length > 0;
    const blocks = await Promise.all(accounts.map(async (account) => {
      const headingId = "grants-" + account;
      const block = el("section", { class: "grants-account", "data-account": account, "aria-labelledby": headingId },
        el("h3", { id: headingId }, account));
      const r = await api("/api/grants/" + encodeURIComponent(account));
      if (r.status === 401) { signOut("The console no longer knows this token; sign in again."); return block; }
      if (!r.body.ok) {
        block.append(el("p", { class: "error", role: "alert" }, describeError(r.body)));
        return block;
      }
      const list = (r.body.grants || []).slice().sort((x, y) => (y.created_at || "").localeCompare(x.created_at || ""));
      if (!list.length) block.append(el("p", { class: "empty" }, "No grant."));
      else block.append(el("ul", { class: "grants" }, ...list.map(renderGrant)));
      return block;
    }));
    if (grant) $("grants").replaceChildren(...blocks);
  }

  function renderGrant(g) {
    const error = el("p", { class: "error", role: "alert" });
    const state = grantState(g);
    const revoke = el("button", { type: "button", class: "reject revoke" }, "Revoke");
    const li = el("li", { "data-grant-id": g.id, class: state === "active" ? "active" : "inactive" });
    revoke.addEventListener("click", async () => {
      revoke.disabled = true;
      error.textContent = "";
      const r = await api("/api/grants/" + encodeURIComponent(g.account) + "/" + encodeURIComponent(g.id) + "/revoke", { method: "POST" });
      if (r.body.ok && r.body.grant) {
        const now = renderGrant(r.body.grant);
        li.replaceWith(now);
        now.querySelector("h4").focus();
        return;
      }
      if (r.status === 401) { signOut("The console no longer knows this token; sign in again."); return; }
      revoke.disabled = false;
      error.textContent = describeError(r.body);
      revoke.focus();
    });
    const when = g.when && Object.keys(g.when).length ? JSON.stringify(g.when) : null;
    li.append(
      el("h4", { tabindex: "-1" }, (g.tools || []).join(", ") + " — ", el("span", { class: "grant-status" }, state)),
      el("dl", {},
        ...field("Grant", g.id, "grant-id"),
        ...field("Scope", g.session_id ? "session " + g.session_id : "every session of " + g.account, "grant-scope"),
        ...field("Tools", (g.tools || []).join(", "), "grant-tools"),
        ...field("When", when),
        ...field("Uses left", g.uses_left === null || g.uses_left === undefined ? "no limit" : String(g.uses_left), "grant-uses"),
        ...field("Expires", g.expires_at, "grant-expires"),
        ...field("Revoked", g.revoked_at, "grant-revoked"),
        ...field("Created by", g.created_by),
        ...field("Created", g.created_at),
        ...field("Approval", g.approval_id)),
      state === "active" ? el("div", {}, revoke) : el("div", {}),
      error);
    return li;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => signOut());
    $("accounts-form").addEventListener("submit", (e) => {
      e.preventDefault();
      sessionStorage.setItem(ACCOUNTS_KEY, $("list-accounts").value.trim());
      connect();
      loadGrants();
    });
    $("for-me-only").addEventListener("change", refreshCounts);
    $("refresh-grants").addEventListener("click", loadGrants);
    refreshCounts();
    if (token()) signIn();
    else $("token").focus();
  });
})();
