# ci/preload.sh: perl (every scalar, array and hash through malloc) with and without
# LD_PRELOAD=libscalemem.so; the output must match. Deterministic: a fixed generator,
# sorted keys.
use strict;
use warnings;
use Digest::SHA qw(sha256_hex);

my $x = 12345;
sub rnd { $x = ($x * 1103515245 + 12345) % 2147483648; return $x; }

my %h;
for my $i (1 .. 300_000) {
    my $k = "k" . (rnd() % 100_000);
    $h{$k} = [ $i, "x" x (rnd() % 300), { n => $i } ];
}
delete $h{ "k" . (rnd() % 100_000) } for 1 .. 50_000;
my $text = join "\n", map { "$_ $h{$_}[0] " . length($h{$_}[1]) } sort keys %h;
print scalar(keys %h), " ", sha256_hex($text), "\n";

# Strings that grow by appending (realloc), then split, sort and join.
my $s = "";
$s .= chr(65 + rnd() % 26) x (1 + rnd() % 50) for 1 .. 100_000;
my @words = sort split /(?<=A)/, $s;
print scalar(@words), " ", sha256_hex(join ",", @words), "\n";

# Regular expressions with captures over a large string.
my %count;
$count{$1}++ while $s =~ /([B-D]{3,})/g;
print join(" ", map { "$_=$count{$_}" } (sort keys %count)[0 .. 9]), "\n";
