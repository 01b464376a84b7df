// Before plotly.js loads: leave the page's MathJax (the site's own copy) alone.
window.PlotlyConfig = { MathJaxConfig: "local" };
