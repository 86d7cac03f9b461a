// Collects uncaught errors from the moment the page starts parsing.
window.__perfscopeErrors = [];
window.__perfscopeError = function (text) {
  window.__perfscopeErrors.push(text);
  var b = document.body;
  if (b && b.getAttribute('data-render') !== 'pending') { b.setAttribute('data-render', 'error'); }
};
window.addEventListener('error', function (e) { window.__perfscopeError(String(e.message || e)); });
window.addEventListener('unhandledrejection', function (e) {
  window.__perfscopeError('unhandled rejection: ' + String(e.reason));
});
