"""Which edits each model needs, which plans a run covers, the model runner's and the fusion guard's sites. No libcst."""
