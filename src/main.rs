//! The `mailstream` command: everything it does is in the library's `cli` folder.

fn main() -> std::process::ExitCode {
    mailstream::cli::main()
}
