# Sourced by the device call 2 scripts: joins libmlx.so (half one stashed by setup.sh, half two
# carried in .gpu/b) into the image's venv once, and points the loader at it.
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/mlx/lib"
[ -s "$SITE/mlx/lib/libmlx.so" ] || { cat /opt/mlxgpu/libmlx.so.xz.00 .gpu/b/libmlx.so.xz.01 | xz -d > "$SITE/mlx/lib/libmlx.so" || exit 1; }
export LD_LIBRARY_PATH="$SITE/mlx/lib" PYTHONUNBUFFERED=1
