// The dashboard's only script (the pages' Content-Security-Policy allows no other): sign in and
// out (the token lives in a cookie of this site, sent with every GET), and the periodic refresh.
"use strict";

(function () {
  var COOKIE = "tessera_token";

  function setToken(value, maxAge) {
    var secure = location.protocol === "https:" ? "; Secure" : "";
    document.cookie = COOKIE + "=" + encodeURIComponent(value) + "; Path=/; SameSite=Strict; Max-Age=" +
      maxAge + secure;
  }

  function signIn() {
    var input = document.getElementById("token");
    var token = input.value.trim();
    if (!token) {
      input.focus();
      return;
    }
    setToken(token, 12 * 3600);
    // Back to the page that asked for a token, else the cluster page.
    location.replace(location.pathname === "/login" ? "/" : location.href);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var signin = document.getElementById("signin");
    if (signin) {
      signin.addEventListener("click", signIn);
      document.getElementById("token").addEventListener("keydown", function (ev) {
        if (ev.key === "Enter") signIn();
      });
    }
    var signout = document.getElementById("signout");
    if (signout) {
      signout.addEventListener("click", function () {
        setToken("", 0);
        location.replace("/login");
      });
    }
    var period = Number(document.body.dataset.refresh || 0);
    var box = document.getElementById("autorefresh");
    if (period > 0 && box) {
      box.checked = sessionStorage.getItem("tessera-autorefresh") !== "off";
      box.addEventListener("change", function () {
        sessionStorage.setItem("tessera-autorefresh", box.checked ? "on" : "off");
      });
      setInterval(function () {
        if (box.checked && document.visibilityState === "visible") location.reload();
      }, period * 1000);
    }
  });
})();
