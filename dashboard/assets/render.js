// Draws every figure from its JSON block, then marks the body with the outcome.
// __CONFIG__ is replaced by the plotly config (JSON) when the page is written.
(function () {
  var errors = window.__perfscopeErrors;
  var body = document.body;
  function finish(n) {
    body.setAttribute('data-figures-rendered', String(n));
    if (errors.length) {
      body.setAttribute('data-render', 'error');
      var box = document.getElementById('render-errors');
      if (box) { box.textContent = 'Some figures failed to draw: ' + errors.join('; '); }
    } else {
      body.setAttribute('data-render', 'ok');
    }
  }
  if (typeof Plotly === 'undefined') {
    errors.push('plotly.js did not load'); finish(0); return;
  }
  var config = __CONFIG__;
  var divs = document.querySelectorAll('div[data-figure]');
  var jobs = [];
  var drawn = 0;
  for (var i = 0; i < divs.length; i++) {
    var div = divs[i];
    try {
      var spec = JSON.parse(document.getElementById(div.getAttribute('data-figure')).textContent);
      jobs.push(Plotly.newPlot(div, spec.data, spec.layout, config).then(function () {
        drawn += 1;
      }));
    } catch (e) {
      errors.push(div.id + ': ' + e.message);
    }
  }
  function settle() {
    Promise.all(jobs).then(function () { finish(drawn); }, function (e) {
      errors.push(String(e)); finish(drawn);
    });
  }
  // Finish after the whole page has run, so errors in later scripts are counted too.
  if (document.readyState === 'complete') { settle(); }
  else { window.addEventListener('load', settle); }
})();
