"""The one pipeline: plan -> patch -> judge hand edits -> prove -> withhold -> write, or serve from an overlay.

``apply``, ``apply --check``, ``verify``, ``diff``, ``revert`` (:mod:`.stages`)
and ``overlay build`` / ``patchcraft run`` (:mod:`.serve`) all go through
it, so a tree is judged the same way whichever command is asked: a command
module parses options and renders what the pipeline returns; it decides
nothing. The stages (docs/architecture.md, "The pipeline"):

1. plan and patch (:func:`patchcraft.engine.tree_run.run`, through the result cache);
2. judge every model file against its pristine text (:mod:`.hand_review`);
3. prove what is about to be written on the CPU harness (:mod:`.proof`);
4. withhold what the harness did not prove, and with ``--model`` what only served it;
5. advise on every refused hand fix (:mod:`.hand_review`);
6. write all files or none (:func:`patchcraft.engine.tree_run.write_changes`), or hand the
   judged result to the overlay (:mod:`.serve`).
"""
