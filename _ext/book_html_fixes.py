"""Small fixes to the rendered HTML that the browser test would otherwise (rightly) flag.

sphinx-thebe 0.3.1 registers its inline configuration script twice under Sphinx 7.4, so every page
declared ``const THEBE_JS_URL`` twice and raised a SyntaxError in the reader's console. This
extension drops exact duplicate script entries from each page's context.
"""


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # Inline scripts are registered once with filename None and once with "": the same script.
        filename = getattr(script, "filename", script) or ""
        key = (str(filename), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
