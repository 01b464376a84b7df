// Point every "launch this notebook" link of a static dashboard at this page's Binder URL
// (the theme's launch button knows the repository, branch and notebook path).
document.addEventListener("DOMContentLoaded", function () {
  var binder = document.querySelector('a[href*="/v2/gh/"], a[href*="/v2/git/"], a[href*="/v2/gl/"]');
  if (!binder) return;
  document.querySelectorAll("a.sazo-launch").forEach(function (link) { link.href = binder.href; });
});
