"""Drives the approvals console as a reviewer in headless Chromium (Debian's chromium +
chromium-driver) with Selenium, for tests/it/console/review.rs.

Argument: JSON {"url", "token", "screenshot", "edited"}. Prints one JSON line per step:
  {"step": "ready", "groups": "..."}     signed in, stream live
  {"step": "remembered", ...}            the routed approval was edited (a text that is not
                                         JSON first, then arguments the tool refuses), approved
                                         and remembered for the session; its grant is listed
  {"step": "revoked", ...}               after a line on stdin: grants refreshed, grant revoked
  {"step": "done"}
or {"fatal": "..."} on failure. Between "ready" and "remembered" the Rust side makes another
group's approval and a parked call routed to ops; between "remembered" and "revoked" it uses
the grant once, then writes a line to stdin.
"""

import json
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from console_browser import console, run, say

MINE = "#pending > li[data-route=mine]"
OTHERS = "#pending > li[data-route=others]"

# Counts the POSTs the page makes from now on: a refused edit must send nothing.
COUNT_POSTS = """
window.__posts = 0;
const original = window.fetch;
window.fetch = function (url, options) {
  if (options && options.method === "POST") window.__posts += 1;
  return original.apply(this, arguments);
};
"""


# The page re-renders entries as approvals and grants change: read by selector in one step,
# never through an element held across a re-render.
READ = "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null;"
ATTRIBUTE = ("const e = document.querySelector(arguments[0]);"
             "return e ? e.getAttribute(arguments[1]) : null;")


def text_of(driver, selector):
    return driver.execute_script(READ, selector)


def replace_text(field, text):
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    field.send_keys(text)


def main(spec):
    with console(spec) as (driver, wait, token):
        token.send_keys(spec["token"], Keys.ENTER)
        wait.until(lambda d: "Live" in d.find_element(By.ID, "connection").text)
        say(step="ready", groups=driver.find_element(By.ID, "groups").text)

        # Both approvals arrive live: one routed to my group, one to another.
        WebDriverWait(driver, 90).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, MINE)
            and d.find_elements(By.CSS_SELECTOR, OTHERS))
        approval_id = driver.execute_script(ATTRIBUTE, MINE, "data-approval-id")
        mine = "#pending > li[data-approval-id='%s']" % approval_id
        mine_note = text_of(driver, mine + " .route")
        others_note = text_of(driver, OTHERS + " .route")
        others_buttons = [b.text for b in driver.find_elements(By.CSS_SELECTOR, OTHERS + " button")]
        assert others_buttons == ["Dismiss"], "another group's approval offers %r" % others_buttons
        reviewers = text_of(driver, mine + " dd.reviewers")
        quorum = text_of(driver, mine + " dd.quorum")

        # "For me" hides the other group's approval.
        driver.find_element(By.ID, "for-me-only").click()
        wait.until(EC.invisibility_of_element_located((By.CSS_SELECTOR, OTHERS)))
        assert driver.find_element(By.CSS_SELECTOR, mine).is_displayed()
        others_hidden = not driver.find_element(By.CSS_SELECTOR, OTHERS).is_displayed()

        driver.execute_script(COUNT_POSTS)
        driver.find_element(By.CSS_SELECTOR, mine + " button.edit-arguments").click()
        editor = wait.until(EC.visibility_of_element_located(
            (By.CSS_SELECTOR, mine + " textarea.edit-arguments")))
        assert driver.switch_to.active_element == editor, "the editor is not focused"
        prefilled = editor.get_attribute("value")
        json.loads(prefilled)

        # Remember for this session, at most two uses, ten minutes.
        driver.find_element(By.CSS_SELECTOR, mine + " details.remember summary").click()
        session = wait.until(EC.visibility_of_element_located(
            (By.CSS_SELECTOR, mine + " input[type=radio][value=session]")))
        session.click()
        driver.find_element(By.CSS_SELECTOR, mine + " input.grant-expiry").send_keys("600")
        driver.find_element(By.CSS_SELECTOR, mine + " input.grant-uses").send_keys("2")
        remember = driver.find_element(By.CSS_SELECTOR, mine + " button.approve-remember")

        # Not JSON: the page says so and sends nothing.
        replace_text(editor, "{not json")
        remember.click()
        wait.until(lambda d: text_of(d, mine + " .edit-error"))
        not_json_error = text_of(driver, mine + " .edit-error")
        posts_after_not_json = driver.execute_script("return window.__posts;")

        # JSON the tool refuses: the gateway's error beside the edit, the edit kept.
        refused = '{"path": 7, "content": "x"}'
        replace_text(editor, refused)
        remember.click()
        wait.until(lambda d: "invalid_arguments" in (text_of(d, mine + " .edit-error") or ""))
        invalid_error = text_of(driver, mine + " .edit-error")
        editor = driver.find_element(By.CSS_SELECTOR, mine + " textarea.edit-arguments")
        edit_kept = editor.get_attribute("value") == refused
        assert driver.find_elements(By.CSS_SELECTOR, mine), "the refused approval left the page"
        # What a refused edit looks like, beside the final screenshot.
        driver.execute_script("arguments[0].scrollIntoView();",
                              driver.find_element(By.CSS_SELECTOR, mine + " h3"))
        driver.save_screenshot(spec["screenshot"].replace(".png", "-refused-edit.png"))

        replace_text(editor, json.dumps(spec["edited"]))
        driver.find_element(By.CSS_SELECTOR, mine + " button.approve-remember").click()
        decided = "#history > li[data-approval-id='%s']" % approval_id
        decided_by = wait.until(lambda d: text_of(d, decided + " .decided-by"))
        edited = text_of(driver, decided + " .edited")
        wait.until(EC.invisibility_of_element_located((By.CSS_SELECTOR, mine)))

        grant = "#grants section[data-account=acme] li[data-grant-id]"
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, grant)))
        grant_id = driver.execute_script(ATTRIBUTE, grant, "data-grant-id")
        say(step="remembered", id=approval_id, mine_note=mine_note, others_note=others_note,
            others_hidden=others_hidden, reviewers=reviewers, quorum=quorum,
            prefilled=prefilled, not_json_error=not_json_error,
            posts_after_not_json=posts_after_not_json, invalid_error=invalid_error,
            edit_kept=edit_kept, decided_by=decided_by, edited=edited, grant_id=grant_id,
            grant_scope=text_of(driver, grant + " .grant-scope"),
            grant_uses=text_of(driver, grant + " .grant-uses"),
            grant_tools=text_of(driver, grant + " dd.grant-tools"))

        # The Rust side uses the grant once, then says go on.
        sys.stdin.readline()
        driver.find_element(By.ID, "refresh-grants").click()
        wait.until(lambda d: text_of(d, grant + " .grant-uses") == "1")
        uses_before = text_of(driver, grant + " .grant-uses")
        driver.find_element(By.CSS_SELECTOR, grant + " button.revoke").click()
        wait.until(lambda d: (text_of(d, grant + " .grant-status") or "").startswith("revoked"))
        status = text_of(driver, grant + " .grant-status")
        assert not driver.find_elements(By.CSS_SELECTOR, grant + " button.revoke"), \
            "a revoked grant still offers Revoke"
        driver.save_screenshot(spec["screenshot"])
        say(step="revoked", uses_before=uses_before, status=status)
        say(step="done")


if __name__ == "__main__":
    run(main)
