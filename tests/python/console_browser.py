"""Drives the approvals console in headless Chromium (Debian's chromium + chromium-driver) with
Selenium, for tests/it/console.rs.

Argument: JSON {"url", "token", "reason", "screenshot"}. Prints one JSON line per step:
  {"step": "ready", "pending": n}      signed in, stream live, no-reload marker set
  {"step": "approved", ...}            the new approval appeared live and was approved
  {"step": "done"}
or {"fatal": "..."} on failure. Between "ready" and "approved" the Rust side makes the gated
call that parks; the script only watches the page.
"""

import contextlib
import json
import shutil
import sys
import traceback

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait


def say(**fields):
    print(json.dumps(fields), flush=True)


def browser():
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,1400"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


@contextlib.contextmanager
def console(spec):
    """A browser on the console at spec["url"], its token field shown: the driver, a 60 s
    wait and the token field. The browser quits after."""
    driver = browser()
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(spec["url"] + "/")
        token = wait.until(EC.presence_of_element_located((By.ID, "token")))
        yield driver, wait, token
    finally:
        driver.quit()


def run(main):
    """Runs main with the JSON spec of the command line; any failure is reported to the Rust
    side as a "fatal" line."""
    try:
        main(json.loads(sys.argv[1]))
    except Exception:  # noqa: BLE001 - any failure is reported to the Rust side
        say(fatal=traceback.format_exc())
        sys.exit(1)


def main(spec):
    with console(spec) as (driver, wait, token):
        # Keyboard only: the token field has the focus, Enter submits.
        assert driver.switch_to.active_element == token, "the token field is not focused"
        label = driver.find_element(By.CSS_SELECTOR, "label[for=token]")
        assert label.text.strip(), "the token field has no label"
        token.send_keys(spec["token"], Keys.ENTER)
        wait.until(lambda d: "Live" in d.find_element(By.ID, "connection").text)
        approver = driver.find_element(By.ID, "approver").text
        pending = driver.find_elements(By.CSS_SELECTOR, "#pending > li")
        # A marker that only survives if the page is never reloaded or navigated.
        driver.execute_script("window.__toolmeshMarker = 'still here';")
        navigations = driver.execute_script(
            "return performance.getEntriesByType('navigation').length;")
        say(step="ready", pending=len(pending), approver=approver)

        item = WebDriverWait(driver, 90).until(
            EC.presence_of_element_located((By.CSS_SELECTOR, "#pending > li[data-approval-id]")))
        marker = driver.execute_script("return window.__toolmeshMarker === 'still here';")
        navigations_after = driver.execute_script(
            "return performance.getEntriesByType('navigation').length;")
        assert navigations_after == navigations, "a navigation happened"
        live = driver.find_element(By.ID, "announce").text
        approval_id = item.get_attribute("data-approval-id")
        tool = item.find_element(By.TAG_NAME, "h3").text.split(" ")[0]
        diff = item.find_element(By.CSS_SELECTOR, "pre.diff").text
        arguments = item.find_element(By.CSS_SELECTOR, "pre.arguments").text
        # Text straight under the entry (not in any element of it): none belongs there.
        stray = driver.execute_script(
            "return Array.from(arguments[0].childNodes).filter(n => n.nodeType === 3)"
            ".map(n => n.textContent).join('');", item)
        # Markup in the arguments stays text: no element was made from it.
        injected = len(item.find_elements(By.CSS_SELECTOR, "pre b, pre img"))
        # Approve with the keyboard: focus the reason, type, Tab to Approve, Enter.
        reason = item.find_element(By.TAG_NAME, "textarea")
        reason.click()
        reason.send_keys(spec["reason"])
        reason.send_keys(Keys.TAB)
        focused = driver.switch_to.active_element
        assert focused.text == "Approve", "Tab after the reason reaches %r" % focused.text
        focused.send_keys(Keys.ENTER)
        # The entry is re-rendered as the approval changes (approved, then used): read it by
        # selector each time rather than holding an element.
        selector = "#history > li[data-approval-id='%s']" % approval_id
        read = ("const e = document.querySelector(arguments[0] + ' ' + arguments[1]);"
                "return e ? e.textContent : null;")
        decided_by = wait.until(lambda d: d.execute_script(read, selector, ".decided-by"))
        wait.until(lambda d: not d.find_elements(
            By.CSS_SELECTOR, "#pending > li[data-approval-id='%s']" % approval_id))
        shown_reason = driver.execute_script(read, selector, ".reason")
        driver.save_screenshot(spec["screenshot"])
        say(step="approved", id=approval_id, tool=tool, diff=diff, arguments=arguments,
            decided_by=decided_by, reason=shown_reason, marker=marker,
            navigations=navigations_after, announced=live, injected=injected,
            stray=stray)
        say(step="done")


if __name__ == "__main__":
    run(main)
