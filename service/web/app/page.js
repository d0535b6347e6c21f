// Every page: sign-in (the key goes in a POST body, never in a URL) and sign-out (with the CSRF token).
"use strict";
(function () {
  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }
  window.stareCsrfToken = csrfToken;

  async function errorMessage(response) {
    try {
      const body = await response.json();
      return body.error.message;
    } catch (err) {
      return "request failed (HTTP " + response.status + ")";
    }
  }
  window.stareErrorMessage = errorMessage;

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("sign-in");
    if (form) {
      form.addEventListener("submit", async function (event) {
        event.preventDefault();
        const field = document.getElementById("api-key");
        const shown = document.getElementById("sign-in-error");
        shown.textContent = "";
        const response = await fetch("/ui/session", {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", "X-Stare-Sign-In": "1" },
          body: JSON.stringify({ api_key: field.value }),
        });
        if (response.ok) {
          field.value = "";
          window.location.assign(form.dataset.next || "/ui/jobs");
          return;
        }
        shown.textContent = await errorMessage(response);
      });
    }
    const signOut = document.getElementById("sign-out");
    if (signOut) {
      signOut.addEventListener("click", async function () {
        await fetch("/ui/session", {
          method: "DELETE",
          credentials: "same-origin",
          headers: { "X-CSRF-Token": csrfToken() },
        });
        window.location.assign("/ui/sign-in");
      });
    }
  });
})();
