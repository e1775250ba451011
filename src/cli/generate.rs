//! `mailstream completions SHELL` and `mailstream man [COMMAND]`: the shell completion
//! script and the manual page, both from the same clap definitions as the parser, so
//! they cannot drift from the flags.

use clap::CommandFactory;

use super::Cli;

/// `mailstream completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<std::process::ExitCode> {
    let mut cli = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, "mailstream", &mut script);
    super::out(String::from_utf8(script)?.trim_end())?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// `mailstream man [COMMAND]`: the manual page (roff) of mailstream, or of one of its
/// commands (`mailstream-kick(1)`), on stdout.
pub fn man(command: Option<&str>) -> anyhow::Result<std::process::ExitCode> {
    let mut cli = Cli::command();
    cli.build();
    let man = match command {
        None => clap_mangen::Man::new(cli),
        Some(name) => {
            let Some(sub) = cli.find_subcommand(name) else {
                let names: Vec<&str> = cli.get_subcommands().map(|s| s.get_name()).collect();
                let known = names.join(", ");
                return Err(super::BadValue(format!("man {name:?}: no such command; one of {known}")).into());
            };
            let page = sub.clone().bin_name(format!("mailstream {name}")).version(env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(page).title(format!("mailstream-{name}"))
        }
    };
    let mut roff = Vec::new();
    man.render(&mut roff)?;
    super::out(String::from_utf8(roff)?.trim_end())?;
    Ok(std::process::ExitCode::SUCCESS)
}
