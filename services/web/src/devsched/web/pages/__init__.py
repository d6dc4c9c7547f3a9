"""The dashboard's pages, one module per family: each page and the live stream of its region.

Pages render from the sampler's snapshot (lab, queue, charts, device) or from one `tasks.get` plus the
task's stored events (task). The HTML is always made here, by autoescaped templates; a page's live region
comes back re-rendered over its event stream (`devsched.web.live`).
"""
