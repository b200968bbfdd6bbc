# Sourced by the scripts: puts rustup's cargo first on PATH when rustup
# installed it, ahead of a distro cargo that may be older than the
# workspace's rust-version.
if [ -x "$HOME/.cargo/bin/cargo" ]; then
    case ":$PATH:" in
        *":$HOME/.cargo/bin:"*) ;;
        *) PATH="$HOME/.cargo/bin:$PATH" ;;
    esac
    export PATH
fi
