"""FlashInfer's JIT cache, in one home: where modules live, which ones, building them, what a cold build costs,
the cache key, checksummed bundles, ninja's staleness test.

FlashInfer 0.7.x runs ninja on every module load, over the build files it wrote when it compiled the module. A module
copied from another host therefore loads without compiling only when ninja agrees nothing changed: the same build
commands (venv, Python, CUDA and cache paths), the same headers, inputs older than the outputs. `layout` is the cache
path and JIT-target rule, `modules` the registry of modules and which a server needs, `build` the one builder,
`cost` the measured cold-build times, `key` says when two hosts agree, a bundle carries a module directory with its
ninja state and a sha256 per file (`bundle`), and `ninja.dry_run` asks ninja itself what a load would do.
"""
