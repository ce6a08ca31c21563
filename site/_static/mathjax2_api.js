/* The widgets' embed bundle (@jupyter-widgets/html-manager) typesets a widget's label with
 * MathJax 2's call, MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]), whenever
 * window.MathJax exists; the site loads MathJax 3, which has no Hub. This file runs before
 * MathJax loads and gives the MathJax 3 object, as soon as it is set, a Hub whose Queue runs
 * MathJax 3's typesetPromise on that element once MathJax has started. */
(function () {
  "use strict";
  function typesetLater(mathjax, element) {
    const started = (mathjax.startup && mathjax.startup.promise) || Promise.resolve();
    started
      .then(() => mathjax.typesetPromise(element ? [element] : undefined))
      .catch((error) => console.error("MathJax could not typeset a widget's label:", error));
  }
  function withHub(mathjax) {
    if (mathjax && mathjax.version && !mathjax.Hub) {  // MathJax 3 itself, not its settings
      mathjax.Hub = {
        Queue: (...commands) => commands.forEach((command) => {
          if (Array.isArray(command) && command[0] === "Typeset") {
            typesetLater(mathjax, command[2]);
          }
        }),
      };
    }
    return mathjax;
  }
  let current = window.MathJax;
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: () => current,
    set: (value) => { current = withHub(value); },
  });
  withHub(current);
})();
