"""FlashInfer's JIT cache built once and shared: the cache key, checksummed bundles, ninja's staleness test.

FlashInfer 0.7.x runs ninja on every module load, over the build files it wrote when it compiled the module. A module
copied from another host therefore loads without compiling only when ninja agrees nothing changed: the same build
commands (venv, Python, CUDA and cache paths), the same headers, inputs older than the outputs. The key says when two
hosts agree (`key`), a bundle carries a module directory with its ninja state and a sha256 per file (`bundle`), and
`ninja.dry_run` asks ninja itself what a load would do.
"""
