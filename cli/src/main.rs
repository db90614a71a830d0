//! `kinesis-checkpoint`: see and steer the lease table of a Lambda function built on
//! kinesis-checkpoint, import checkpoints from other consumers, and check a deployment.
//! `kinesis-checkpoint --help` lists the commands; the README's operator sections say when to
//! use each.

// The doc comments below are clap's help text, read in a terminal: backticks would show.
#![allow(clippy::doc_markdown)]

use std::io::{BufRead, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
use kinesis_checkpoint_cli::checkpoint::{Options, Target, move_checkpoint};
use kinesis_checkpoint_cli::{Error, aws_config, deployed, doctor, import, status};

/// See and steer a kinesis-checkpoint lease table.
///
/// AWS settings come from the environment (AWS_REGION, AWS_PROFILE, credentials);
/// AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_DYNAMODB and AWS_ENDPOINT_URL_KINESIS point it at other
/// endpoints.
#[derive(Debug, Parser)]
#[command(name = "kinesis-checkpoint", version)]
struct Cli {
    /// Send every AWS request to this endpoint (a local emulator, say).
    #[arg(long, global = true, value_name = "URL")]
    endpoint_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One line per shard: lease, checkpoint, parents, failing record, and how far behind.
    Status {
        /// The lease table.
        #[arg(long)]
        table: String,
        /// Only this stream; its shards without a row are listed too.
        #[arg(long)]
        stream: Option<String>,
        /// Do not read the stream (no lag).
        #[arg(long)]
        no_lag: bool,
        /// JSON for scripts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Move a shard's checkpoint: after a sequence number, to the trim horizon, or finished.
    SetCheckpoint {
        #[command(flatten)]
        shard: ShardArgs,
        /// The last record done: the next batch starts after it.
        #[arg(long, value_name = "SEQUENCE_NUMBER", conflicts_with_all = ["trim_horizon", "finished"], required_unless_present_any = ["trim_horizon", "finished"])]
        sequence: Option<String>,
        /// With --sequence: the last user record done inside that KPL aggregate (the row then
        /// holds that aggregate's progress and no `checkpoint`, since no record before it is
        /// known done whole; a seed or KCL reader would start from its initial position).
        #[arg(long, requires = "sequence")]
        sub_sequence: Option<u64>,
        /// No checkpoint: start from the mapping's starting position.
        #[arg(long, conflicts_with = "finished")]
        trim_horizon: bool,
        /// SHARD_END: the shard is done and its children may run.
        #[arg(long)]
        finished: bool,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Remove a shard's checkpoint (and failing record): it starts over from the mapping's
    /// starting position.
    Reset {
        #[command(flatten)]
        shard: ShardArgs,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Copy the bare-shard-id rows of earlier seed crate versions under `stream:shard`.
    ImportLegacy {
        /// The lease table.
        #[arg(long)]
        table: String,
        /// The stream the bare rows belong to.
        #[arg(long)]
        stream: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Copy a KCL application's checkpoints into the lease table.
    ImportKcl {
        /// The KCL application's lease table (named after the application).
        #[arg(long)]
        kcl_table: String,
        /// The toolkit's lease table.
        #[arg(long)]
        table: String,
        /// The stream (required for a single-stream KCL application).
        #[arg(long)]
        stream: Option<String>,
        /// Do not read the stream to tell plain records from KPL aggregates.
        #[arg(long)]
        offline: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Check the Kinesis event source mappings of a SAM or CloudFormation template, or of a
    /// deployed function (Lambda and IAM APIs).
    Doctor {
        /// The template (offline; the default).
        #[arg(long, default_value = "template.yaml", conflicts_with = "function")]
        template: std::path::PathBuf,
        /// A deployed function's name or ARN: its mappings, environment and role are read from
        /// the Lambda and IAM APIs.
        #[arg(long)]
        function: Option<String>,
        /// JSON for scripts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct ShardArgs {
    /// The lease table.
    #[arg(long)]
    table: String,
    /// The stream.
    #[arg(long)]
    stream: String,
    /// The shard id.
    #[arg(long)]
    shard: String,
}

#[derive(Debug, Args)]
struct WriteArgs {
    /// Take a live lease from its holder (its records run again).
    #[arg(long)]
    force: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    if let Command::Doctor {
        template,
        function,
        json,
    } = &cli.command
    {
        return doctor_command(
            template,
            function.as_deref(),
            *json,
            cli.endpoint_url.as_deref(),
            &mut out,
        )
        .await;
    }
    let config = aws_config(cli.endpoint_url.as_deref()).await;
    match cli.command {
        Command::Status {
            table,
            stream,
            no_lag,
            json,
        } => {
            let store = DynamoLeaseStore::new(&config, table);
            let kinesis = (!no_lag).then(|| aws_sdk_kinesis::Client::new(&config));
            let shards = status::collect(&store, kinesis.as_ref(), stream.as_deref()).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&shards)?)?;
            } else {
                write!(out, "{}", status::table(&shards))?;
            }
        }
        Command::SetCheckpoint {
            shard,
            sequence,
            sub_sequence,
            trim_horizon,
            finished,
            write,
        } => {
            let target = if finished {
                Target::Finished
            } else if trim_horizon {
                Target::TrimHorizon
            } else {
                let sequence = sequence.unwrap_or_default();
                let parsed = sequence
                    .parse()
                    .map_err(|error| format!("--sequence '{sequence}': {error}"))?;
                Target::At(match sub_sequence {
                    Some(sub) => Position::sub_record(parsed, sub),
                    None => Position::record(parsed),
                })
            };
            set(&config, &shard, &target, &write, &mut input, &mut out).await?;
        }
        Command::Reset { shard, write } => {
            set(
                &config,
                &shard,
                &Target::TrimHorizon,
                &write,
                &mut input,
                &mut out,
            )
            .await?;
        }
        Command::ImportLegacy { table, stream, yes } => {
            let store = DynamoLeaseStore::new(&config, table);
            let rows = store.rows(|_| ()).await?;
            let plan = import::legacy_plan(&rows, &stream);
            import::apply(&store, &plan, yes, &mut input, &mut out).await?;
        }
        Command::ImportKcl {
            kcl_table,
            table,
            stream,
            offline,
            yes,
        } => {
            let store = DynamoLeaseStore::new(&config, table);
            let dynamodb = aws_sdk_dynamodb::Client::new(&config);
            let kinesis = (!offline).then(|| aws_sdk_kinesis::Client::new(&config));
            let plan = import::kcl_plan(&dynamodb, &kcl_table, stream.as_deref(), kinesis.as_ref())
                .await?;
            import::apply(&store, &plan, yes, &mut input, &mut out).await?;
        }
        Command::Doctor { .. } => unreachable!("handled above"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn set(
    config: &aws_config::SdkConfig,
    shard: &ShardArgs,
    target: &Target,
    write: &WriteArgs,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let store = DynamoLeaseStore::new(config, &shard.table);
    let key = LeaseKey::new(shard.stream.as_str(), shard.shard.as_str());
    let options = Options {
        force: write.force,
        yes: write.yes,
    };
    move_checkpoint(&store, &key, target, options, input, out).await?;
    Ok(())
}

/// `doctor`: the template's mappings offline, or a deployed function's through the APIs; fails
/// on any error found.
async fn doctor_command(
    template: &std::path::Path,
    function: Option<&str>,
    json: bool,
    endpoint_url: Option<&str>,
    out: &mut impl Write,
) -> Result<ExitCode, Error> {
    let findings = if let Some(function) = function {
        let config = aws_config(endpoint_url).await;
        deployed::check_function(&config, function).await?
    } else {
        let text = std::fs::read_to_string(template)
            .map_err(|error| format!("cannot read {}: {error}", template.display()))?;
        doctor::check_template(&text)?
    };
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&findings)?)?;
    } else {
        write!(out, "{}", doctor::report(&findings))?;
    }
    let failed = findings
        .iter()
        .any(|f| f.severity == doctor::Severity::Error);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
